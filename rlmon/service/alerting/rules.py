"""Alert rules as data: a pydantic model for YAML rule files, and the default pack.

The default pack is the table of docs/design.md ("Default alert rules"): the threshold rules
come from the AlertSpecs in the catalog; the structural ones (non-finite values, physical
domains, missing ranks, replica disagreement) apply to every metric and are declared here. The
early-warning rules (issue 16) follow: each compares a metric with its run's own baseline
(:mod:`rlmon.service.alerting.baseline`), declared in the catalog's ``EARLY_WARNINGS``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rlmon.service.alerting import reward_hacking
from rlmon.service.alerting.conditions.drift import BASELINE_FIELDS, BASELINE_MAX_WINDOW
from rlmon.service.alerting.conditions.kind import ANY_METRIC, Condition
from rlmon.service.alerting.conditions.registry import CONDITIONS, LIVENESS_CONDITIONS, kind_of
from rlmon.service.alerting.reward_hacking import RewardHackingParams
from rlmon.service.metrics import catalog
from rlmon.service.metrics.spec import (
    AlertSpec,
    BaselineParams,
    BaselineSpec,
    Comparison,
    LivenessAlertSpec,
    Severity,
)

__all__ = [
    "ANY_METRIC",
    "LIVENESS_CONDITIONS",
    "Condition",
    "Rule",
    "RuleError",
    "RuleFile",
    "default_rules",
    "early_warning_rules",
    "fixed_rules",
    "liveness_rules",
    "load_rules",
    "parse_rules",
    "reward_hacking_rule",
    "rules_to_yaml",
    "unknown_metrics",
]


# what each condition means, which fields it reads and how it is worded: its kind
# (rlmon.service.alerting.conditions); the fields a rule gives another condition are an error
_CONDITION_FIELDS = tuple(dict.fromkeys(f for kind in CONDITIONS.values() for f in kind.fields))


class Rule(BaseModel):
    """One alert rule. ``for`` counts consecutive evaluated steps of one (run, role)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    name: str = Field(pattern=r"^[A-Za-z][A-Za-z0-9_]*$", max_length=128)
    severity: Severity
    condition: Condition
    metric: str = ANY_METRIC
    op: Literal[">", ">=", "<", "<=", "abs<"] | None = None
    threshold: float | None = None
    low: float | None = None
    high: float | None = None
    window: int | None = Field(default=None, ge=2, le=10_000)
    direction: Literal["up", "down"] | None = None
    tolerance: float = Field(default=0.0, ge=0.0)
    # condition "baseline" (see rlmon.service.alerting.baseline); None takes BaselineParams' default
    warmup: int | None = Field(default=None, ge=8, le=BASELINE_MAX_WINDOW)
    allowance: float | None = Field(default=None, ge=0.0)
    decision: float | None = Field(default=None, gt=0.0)
    floor: float | None = Field(default=None, ge=0.0)
    relative_floor: float | None = Field(default=None, ge=0.0)
    log_offset: float | None = Field(default=None, gt=0.0)
    follow_drift: bool | None = None
    spike_steps: int | None = Field(default=None, ge=1, le=100)
    for_steps: int = Field(default=1, ge=1, le=100_000, alias="for")
    # hysteresis: good steps before a firing alert resolves (Prometheus' keep_firing_for), and
    # for threshold/outside rules a margin (in the metric's units) the value must clear the
    # threshold by before a step counts as good
    resolve_after: int | None = Field(default=None, ge=1, le=100_000)
    resolve_margin: float | None = Field(default=None, ge=0.0)
    # escalation of a warning (threshold/baseline): critical once the value crosses `critical`
    # (on the rule's side) or once it has fired for `escalate_after` steps
    critical: float | None = None
    escalate_after: int | None = Field(default=None, ge=1, le=1_000_000)
    # baseline rules watching a fall: critical once the value is more than this share below
    # its own pre-onset level (0.9: under a tenth of it), a collapse whatever its absolute level
    critical_drop: float | None = Field(default=None, gt=0.0, lt=1.0)
    # baseline rules watching a rise: critical once the value has not moved at all for this many
    # steps while firing (a mean pinned at a hard limit: every completion at the length cap)
    critical_pinned: int | None = Field(default=None, ge=2, le=1_000)
    # baseline: the fixed rule judging the level the slide heads to (hands over to it)
    level_rule: str = ""
    roles: tuple[str, ...] | None = None
    summary: str = ""
    # besides notifying: "stop" asks the run to stop, where the config's stop.runs allows it
    actions: tuple[Literal["stop"], ...] = ()

    @model_validator(mode="after")
    def _fields_for_condition(self) -> Rule:
        kind = kind_of(self)
        for name in ("threshold", "low", "high"):
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                raise ValueError(f"'{name}' must be a finite number, got {value}")
        stray = [f for f in _CONDITION_FIELDS if getattr(self, f) is not None
                 and f not in kind.fields]
        if stray:
            raise ValueError(f"'{stray[0]}' does not apply to condition {self.condition.value!r}")
        if kind.needs_metric and self.metric == ANY_METRIC:
            raise ValueError(f"condition {self.condition.value!r} needs a concrete 'metric'")
        kind.validate(self)
        self._check_hysteresis()
        return self

    def _check_hysteresis(self) -> None:
        cond = self.condition
        if self.resolve_margin is not None and cond not in (Condition.THRESHOLD,
                                                            Condition.OUTSIDE):
            raise ValueError(f"'resolve_margin' does not apply to condition {cond.value!r}")
        if self.critical is not None:
            if cond not in (Condition.THRESHOLD, Condition.BASELINE):
                raise ValueError(f"'critical' does not apply to condition {cond.value!r}")
            if not math.isfinite(self.critical):
                raise ValueError(f"'critical' must be a finite number, got {self.critical}")
            if cond is Condition.THRESHOLD and self.op == "abs<":
                raise ValueError("'critical' does not apply to op 'abs<'")
        if self.critical_drop is not None and (cond is not Condition.BASELINE
                                               or self.direction != "down"):
            raise ValueError("'critical_drop' applies to condition 'baseline' with direction "
                             "'down' only")
        if self.critical_pinned is not None and (cond is not Condition.BASELINE
                                                 or self.direction != "up"):
            raise ValueError("'critical_pinned' applies to condition 'baseline' with direction "
                             "'up' only")
        if (self.critical is not None or self.escalate_after is not None
                or self.critical_drop is not None or self.critical_pinned is not None) \
                and self.severity is Severity.CRITICAL:
            raise ValueError("'critical' and 'escalate_after' escalate a warning; this rule is "
                             "critical already")

    @property
    def baseline(self) -> BaselineParams:
        """The detector's parameters (condition ``baseline``); unset fields take the defaults."""
        assert self.direction is not None
        given = {name: getattr(self, name) for name in ("window", *BASELINE_FIELDS)}
        return BaselineParams(self.direction, **{k: v for k, v in given.items() if v is not None})

    @property
    def reward_hacking(self) -> RewardHackingParams:
        """The detector's parameters (condition ``reward_hacking``); unset fields: defaults."""
        given = {n: getattr(self, n) for n in ("window", "allowance", "decision")}
        return RewardHackingParams(**{k: v for k, v in given.items() if v is not None})

    def crosses_critical(self, value: float | None) -> bool:
        """Whether ``value`` is on the rule's side of its critical bound."""
        bound = self.critical
        if bound is None or value is None or not math.isfinite(value):
            return False
        side = self.direction if self.condition is Condition.BASELINE else (
            "up" if self.op in (">", ">=") else "down")
        return value >= bound if side == "up" else value <= bound

    def describe_critical(self, before: float | None = None) -> str:
        """The critical level in words (the condition an escalated alert quotes), "" when the
        rule has none; ``before``: the pre-onset level a ``critical_drop`` is judged from."""
        if self.critical_drop is not None and before is not None and (
                self.critical is None or (1 - self.critical_drop) * before > self.critical):
            return (f"{self.metric} <= {(1 - self.critical_drop) * before:.3g}, "
                    f"{self.critical_drop:.0%} below its own pre-onset level {before:.3g} "
                    "(the critical level)")
        if self.critical is None:
            return ""
        if self.condition is Condition.BASELINE:
            op = ">=" if self.direction == "up" else "<="
        else:
            op = self.op or ">"
        return f"{self.metric} {op} {self.critical:g} (the critical level)"

    @property
    def resolve_steps(self) -> int:
        """Consecutive false steps before a firing alert resolves (defaults to ``for``)."""
        return self.resolve_after if self.resolve_after is not None else self.for_steps

    def describe(self) -> str:
        """The condition in words, for notifications and docs (its kind's words)."""
        text = kind_of(self).describe(self)
        return text + (f" for {self.for_steps} steps" if self.for_steps > 1 else "")


class RuleFile(BaseModel):
    """A user rule file: overrides and additions on top of the default pack."""

    model_config = ConfigDict(extra="forbid")

    include_defaults: bool = True
    early_warning: bool = True  # with the defaults: also the early-warning (baseline) rules
    disable: list[str] = Field(default_factory=list)
    # actions added to rules by name (a default rule's included), e.g. {NonFiniteMetric: [stop]}
    actions: dict[str, list[Literal["stop"]]] = Field(default_factory=dict)
    rules: list[dict[str, Any]] = Field(default_factory=list)


class RuleError(ValueError):
    """A rule file is invalid; the message names the rule and the field."""


def _rule_from_spec(metric: str, spec: AlertSpec) -> Rule:
    if spec.comparison is Comparison.OUTSIDE:
        fields: dict[str, Any] = {
            "condition": Condition.OUTSIDE, "low": spec.threshold, "high": spec.high,
        }
    else:
        fields = {
            "condition": Condition.THRESHOLD, "op": spec.comparison.value,
            "threshold": spec.threshold,
        }
    fields.update(name=spec.name, severity=spec.severity, metric=metric, summary=spec.summary,
                  resolve_after=spec.resolve_after, critical=spec.critical,
                  escalate_after=spec.escalate_after, resolve_margin=spec.resolve_margin)
    fields["for"] = spec.for_steps
    return Rule.model_validate(fields)


def _rule_from_baseline(spec: BaselineSpec) -> Rule:
    p = spec.params
    fields: dict[str, Any] = {
        "name": spec.name, "severity": Severity.WARNING, "condition": Condition.BASELINE,
        "metric": spec.metric, "direction": p.direction, "window": p.window, "warmup": p.warmup,
        "allowance": p.allowance, "decision": p.decision, "relative_floor": p.relative_floor,
        "follow_drift": p.follow_drift, "spike_steps": p.spike_steps, "for": spec.for_steps,
        "resolve_after": spec.resolve_after, "summary": spec.summary,
        "level_rule": spec.level_rule, "critical_drop": spec.critical_drop,
        "critical_pinned": spec.critical_pinned,
    }
    if p.log_offset is not None:
        fields["log_offset"] = p.log_offset
    else:
        fields["floor"] = p.floor
    return Rule.model_validate(fields)


def _straggler_rule(spec: AlertSpec) -> Rule:
    return Rule.model_validate({
        "name": spec.name, "severity": spec.severity, "condition": Condition.STRAGGLER_RANK,
        "metric": catalog.STRAGGLER_METRIC, "threshold": spec.threshold, "for": spec.for_steps,
        "resolve_after": spec.resolve_after, "summary": spec.summary,
    })


def _liveness_rule(spec: LivenessAlertSpec) -> Rule:
    return Rule(name=spec.name, severity=spec.severity, condition=Condition(spec.condition),
                summary=spec.summary)


def liveness_rules() -> list[Rule]:
    """The time-based rules (catalog ``LIVENESS_ALERTS``); their thresholds are the config's
    ``liveness`` section, so a rule file can disable or reroute them, not retune them."""
    return [_liveness_rule(spec) for spec in catalog.LIVENESS_ALERTS]


def default_rules() -> list[Rule]:
    """The fixed-threshold pack followed by the early-warning rules."""
    return fixed_rules() + early_warning_rules()


def early_warning_rules() -> list[Rule]:
    """One baseline rule per entry of the catalog's ``EARLY_WARNINGS`` (severity warning), and
    the reward-hacking rule, also judged against the run's own past."""
    return [_rule_from_baseline(spec) for spec in catalog.EARLY_WARNINGS] + [reward_hacking_rule()]


def reward_hacking_rule() -> Rule:
    """``RewardHacking`` (rlmon.service.alerting.reward_hacking), on the reward's stream."""
    return Rule.model_validate({
        "name": reward_hacking.ALERT, "severity": Severity.WARNING,
        "condition": Condition.REWARD_HACKING, "metric": catalog.REWARD,
        "resolve_after": 3, "summary": reward_hacking.SUMMARY})


def fixed_rules() -> list[Rule]:
    """The default pack (docs/design.md, "Default alert rules"), in the table's order of concern."""
    rules = [
        _rule_from_spec(spec.name, alert) for spec in catalog.metrics() for alert in spec.alerts
    ]
    rules += [
        Rule(name="NonFiniteMetric", severity=Severity.CRITICAL, condition=Condition.NON_FINITE,
             summary="A metric is NaN or Inf"),
        Rule(name="RankMissing", severity=Severity.CRITICAL, condition=Condition.RANK_MISSING,
             summary="A step finalized without every expected rank"),
        Rule(name="ReplicaMismatch", severity=Severity.CRITICAL,
             condition=Condition.REPLICA_MISMATCH, summary="Replicated copies disagree"),
        Rule(name="MetricOutOfDomain", severity=Severity.CRITICAL,
             condition=Condition.OUT_OF_DOMAIN, summary="A value outside its physical domain"),
        _straggler_rule(catalog.STRAGGLER_ALERT),
        *liveness_rules(),
    ]
    return rules


def _location(loc: Sequence[int | str]) -> str:
    return ".".join(str(part) for part in loc) or "(rule)"


def _parse_rule(index: int, raw: Any, base: Mapping[str, Rule]) -> Rule:
    """A rule of the file; one that names a rule of the pack without a ``condition`` retunes
    it: the fields it gives replace the pack rule's, the others are kept."""
    if not isinstance(raw, dict):
        raise RuleError(f"rules[{index}]: a rule must be a mapping, got {type(raw).__name__}")
    label = f"rules[{index}] ({raw.get('name', 'unnamed')})"
    retuned = base.get(raw.get("name", "")) if "condition" not in raw else None
    if retuned is not None:
        raw = {**retuned.model_dump(by_alias=True, exclude_none=True), **raw}
    try:
        return Rule.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            (f"{_location(e['loc'])}: " if e["loc"] else "")
            + e["msg"]
            + (f" (got {e['input']!r})" if e["type"] != "missing" and e["loc"] else "")
            for e in exc.errors()
        )
        raise RuleError(f"{label}: {problems}") from None


def parse_rules(text: str, source: str = "rules") -> list[Rule]:
    """Parse a rule file on top of the defaults; raise :class:`RuleError` with the rule and field."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise RuleError(f"{source}: not valid YAML: {exc}") from None
    if data is None:
        data = {}
    if isinstance(data, list):
        data = {"rules": data}
    try:
        spec = RuleFile.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{_location(e['loc'])}: {e['msg']}" for e in exc.errors())
        raise RuleError(f"{source}: {problems}") from None
    base = []
    if spec.include_defaults:
        base = default_rules() if spec.early_warning else fixed_rules()
    by_name = {r.name: r for r in base}
    user = [_parse_rule(i, raw, by_name) for i, raw in enumerate(spec.rules)]
    names = [r.name for r in user]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise RuleError(f"{source}: rule {sorted(dup)[0]!r} is defined more than once")
    known = {r.name for r in base} | set(names)
    for name in spec.disable:
        if name not in known:
            raise RuleError(f"{source}: disable: no rule named {name!r}")
    for name in spec.actions:
        if name not in known:
            raise RuleError(f"{source}: actions: no rule named {name!r}")
    overridden = set(names)
    merged = [r for r in base if r.name not in overridden] + user
    merged = [r.model_copy(update={"actions": tuple(dict.fromkeys(
        (*r.actions, *spec.actions[r.name])))}) if r.name in spec.actions else r for r in merged]
    return [r for r in merged if r.name not in set(spec.disable)]


def unknown_metrics(rules: Iterable[Rule]) -> list[str]:
    """Warnings for rules watching a metric the catalog does not define (a typo, or custom)."""
    return [
        f"rule {r.name!r}: metric {r.metric!r} is not in the catalog (a custom metric, or a typo?)"
        for r in rules
        if r.metric != ANY_METRIC and catalog.lookup(r.metric) is None
    ]


def load_rules(path: str | Path | None) -> list[Rule]:
    """The default pack, or a rule file on top of it."""
    if path is None:
        return default_rules()
    p = Path(path)
    return parse_rules(p.read_text(encoding="utf-8"), source=str(p))


def rules_to_yaml(rules: Iterable[Rule]) -> str:
    """Rules as a YAML rule file (``include_defaults: false``), e.g. to start customising."""
    items = []
    for rule in rules:
        item = rule.model_dump(mode="json", by_alias=True, exclude_defaults=True)
        item.setdefault("for", rule.for_steps)
        items.append(item)
    return yaml.safe_dump({"include_defaults": False, "rules": items}, sort_keys=False)
