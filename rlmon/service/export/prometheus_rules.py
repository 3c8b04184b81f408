"""Prometheus alerting rules generated from the same rule pack the engine evaluates.

Prometheus evaluates on wall-clock time, rlmon on steps, so the translation is approximate and the
file says so where it matters. rlmon fires at the Nth consecutive bad step, (N-1) step periods
after the first one (t0 + (N-1)P), so "for N steps" becomes ``for: (N-1) x step period`` (none for
N = 1); resolving at the Nth good step becomes ``keep_firing_for: (N-1) x step period``.
Each rule's expression, or why rlmon alone can judge it, is its condition kind's
(:meth:`rlmon.service.alerting.conditions.kind.ConditionKind.promql`): structural rules read the
exporter's per-step counts (``rlmon_nonfinite_metrics`` ...) so both paths agree on what counts
as bad; early-warning (baseline) rules are left out, and the file says why: each keeps a per-run
trailing window and a CUSUM score across steps, which a PromQL expression over wall-clock ranges
cannot reproduce step for step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import yaml

from rlmon.service.alerting.conditions.kind import RlmonOnly
from rlmon.service.alerting.conditions.registry import kind_of
from rlmon.service.alerting.rules import Rule, default_rules
from rlmon.service.alerting.what_to_check import what_to_check
from rlmon.service.artifact import Artifact

__all__ = [
    "DEFAULT_STEP_PERIOD",
    "PROMETHEUSRULE_PATH",
    "PROMETHEUS_RULES_PATH",
    "PromRule",
    "artifacts",
    "duration",
    "render",
    "translate",
]

DEFAULT_STEP_PERIOD = 60.0
DEFAULT_JOB = "rlmon"  # the scrape job of rlmon's /metrics (the chart's PodMonitor sets it)
# kube-prometheus-stack's Prometheus selects PrometheusRules labelled `release: <its release>`
DEFAULT_RELEASE = "kube-prometheus-stack"
DEFAULT_EVAL_INTERVAL = "30s"
PROMETHEUS_RULES_PATH = "dashboards/prometheus-rules.yaml"
PROMETHEUSRULE_PATH = "dashboards/prometheusrule.yaml"
GROUP = "rlmon"

@dataclass(frozen=True, slots=True)
class PromRule:
    """One translated alerting rule and the caveats to print above it."""

    alert: str
    expr: str
    for_: str | None
    keep_firing_for: str | None
    severity: str
    summary: str
    description: str
    notes: tuple[str, ...]


def duration(seconds: float) -> str:
    """A Prometheus duration (``90s`` -> ``1m30s``), rounded up to whole seconds."""
    total = max(0, math.ceil(seconds))
    if total == 0:
        return "0s"
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return "".join(f"{v}{u}" for v, u in ((hours, "h"), (minutes, "m"), (secs, "s")) if v)


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def translate(rules: Sequence[Rule], step_period: float) -> tuple[list[PromRule], list[str]]:
    """Translate what PromQL can express; also returns the names of the rules left out."""
    out, left_out = _translate(rules, step_period)
    return out, list(left_out)


def _translate(rules: Sequence[Rule], step_period: float,
               ) -> tuple[list[PromRule], dict[str, RlmonOnly]]:
    """The translated rules, and each rule left out with why: each rule's expression is its
    condition kind's (rlmon.service.alerting.conditions)."""
    out: list[PromRule] = []
    skipped: dict[str, RlmonOnly] = {}
    for rule in rules:
        found = kind_of(rule).promql(rule)
        if isinstance(found, RlmonOnly):
            skipped[rule.name] = found
            continue
        notes = [found.note] if found.note else []
        for_ = keep = None
        if rule.for_steps > 1:
            for_ = duration((rule.for_steps - 1) * step_period)
            notes.insert(0, f"rlmon fires at the {_ordinal(rule.for_steps)} bad step, {for_} after the "
                         f"first at {step_period:g}s per step (Prometheus counts time, rlmon "
                         "counts steps)")
        if rule.resolve_steps > 1:
            keep = duration((rule.resolve_steps - 1) * step_period)
            notes.insert(1 if for_ else 0, f"rlmon resolves at the {_ordinal(rule.resolve_steps)} good "
                         f"step; keep_firing_for: {keep} approximates that")
        check = what_to_check(rule.condition, rule.metric)
        description = "{{ $labels.run }}/{{ $labels.role }}: " + rule.describe()
        if found.quotes_value:
            description += " (value {{ $value }})"
        if check:
            description += ". What to check: " + check
        out.append(PromRule(rule.name, found.expr, for_, keep, rule.severity.value,
                            rule.summary or rule.describe(), description, tuple(notes)))
    return out, skipped


def monitor_rules(job: str = DEFAULT_JOB, down_for: str = "2m") -> list[dict[str, object]]:
    """The monitor's own liveness (the dead man's switch, as kube-prometheus does it): a
    ``Watchdog`` that always fires, so a receiver that stops hearing it (PagerDuty's or a
    heartbeat service's) knows the alerting pipeline is down, and ``RlmonDown`` when
    Prometheus cannot scrape rlmon (or no longer finds its target). See docs/liveness.md."""
    return [
        {"alert": "Watchdog", "expr": "vector(1)",
         "labels": {"severity": "none", "source": "rlmon"},
         "annotations": {
             "summary": "Always firing: the alerting pipeline is alive",
             "description": "This alert fires for ever on purpose. Route it to a dead man's "
                            "switch (a PagerDuty heartbeat, healthchecks.io, Dead Man's "
                            "Snitch) that pages when it stops arriving: then Prometheus, "
                            "Alertmanager or the route between them is down, and no other "
                            "alert would reach you either."}},
        {"alert": "RlmonDown",
         "expr": f'up{{job="{job}"}} == 0 or absent(up{{job="{job}"}})', "for": down_for,
         "labels": {"severity": "critical", "source": "rlmon"},
         "annotations": {
             "summary": "rlmon's /metrics cannot be scraped: its alerts and liveness are blind",
             "description": f"Prometheus has not scraped job {job!r} for {down_for} (down, or "
                            "no target found). While rlmon is down no training alert, stall "
                            "or dead run is paged. Check the rlmon pod (kubectl logs, events) "
                            "or `rlmon serve` process, and the PodMonitor's selector."}},
    ]


def _rule_dict(rule: PromRule) -> dict[str, object]:
    item: dict[str, object] = {"alert": rule.alert, "expr": rule.expr}
    if rule.for_:
        item["for"] = rule.for_
    if rule.keep_firing_for:
        item["keep_firing_for"] = rule.keep_firing_for
    item["labels"] = {"severity": rule.severity, "source": "rlmon"}
    item["annotations"] = {"summary": rule.summary, "description": rule.description}
    return item


def _dump(obj: object, indent: int) -> list[str]:
    text = yaml.safe_dump(obj, sort_keys=False, width=4096, allow_unicode=True)
    pad = " " * indent
    return [pad + line for line in text.rstrip("\n").split("\n")]


def render(
    rules: Sequence[Rule] | None = None, *, step_period: float = DEFAULT_STEP_PERIOD,
    fmt: str = "prometheus", interval: str = DEFAULT_EVAL_INTERVAL,
    release: str = DEFAULT_RELEASE, job: str = DEFAULT_JOB, monitor: bool = True,
) -> str:
    """A Prometheus rule file (``prometheus``) or a prometheus-operator PrometheusRule, the
    latter labelled ``release: <release>`` (none when empty)."""
    rules = default_rules() if rules is None else rules
    translated, skipped = _translate(rules, step_period)
    head = [
        "# Generated by `rlmon rules export` from rlmon's rule pack; do not edit.",
        f"# Step period assumed: {step_period:g}s (prometheus_rules.step_period_seconds).",
        "# Prometheus evaluates wall-clock time while rlmon counts steps, so `for:` is approximate.",
        "# rlmon fires at the Nth consecutive bad step, (N-1) periods after the first, so",
        "# `for: (N-1) x period` (no `for:` when N = 1); resolving at the Nth good step likewise",
        "# becomes `keep_firing_for: (N-1) x period`.",
        "# A stalled run keeps its last values until the exporter's TTL drops its series.",
        "# A NaN value compares false in every threshold; NonFiniteMetric covers it.",
    ]
    if fmt == "prometheusrule":
        head.append(
            f"# Labelled release: {release} (kube-prometheus-stack selects rules by its release "
            "name; `rlmon rules export --release NAME`)." if release else
            "# No release label (`--release ''`): set ruleSelectorNilUsesHelmValues: false in "
            "kube-prometheus-stack, or Prometheus will not load it.")
    def left_out(*why: RlmonOnly) -> list[str]:
        return [name for name, reason in skipped.items() if reason in why]

    other = left_out(RlmonOnly.NO_SERIES, RlmonOnly.STEP_HISTORY)
    straggler = left_out(RlmonOnly.TIMELINES)
    live = left_out(RlmonOnly.OPEN_SPANS)
    early = left_out(RlmonOnly.RUN_STATE)  # RewardHacking keeps per-run state too
    if other:
        head.append("# Not expressible in PromQL (evaluated by rlmon only): " + ", ".join(other))
    if straggler:
        head += [
            "# Evaluated by rlmon only: " + ", ".join(straggler) + " (which rank is slowest, and",
            "# whether it is the same rank step after step, comes from the ranks' timelines,",
            "# which are not exported)",
        ]
    if live:
        head += [
            "# Evaluated by rlmon only: " + ", ".join(live) + " (each rank's open spans and a",
            "# per-run step-time baseline are not exported; RunStalled and RunDied are below)",
        ]
    if early:
        head += [
            "# Early-warning rules, evaluated by rlmon only (its engine and `rlmon replay`): each",
            "# compares every step with its run's own trailing baseline and keeps a CUSUM score",
            "# across steps; PromQL has no per-run step state to reproduce that, so they are left",
            "# out rather than approximated: " + ", ".join(early),
        ]
    if fmt == "prometheus":
        lines = [*head, "groups:", f"  - name: {GROUP}", f"    interval: {interval}", "    rules:"]
        indent = 6
    elif fmt == "prometheusrule":
        lines = [
            *head,
            "apiVersion: monitoring.coreos.com/v1",
            "kind: PrometheusRule",
            "metadata:",
            "  name: rlmon",
            "  labels:",
            "    app.kubernetes.io/name: rlmon",
            *([f"    release: {yaml.safe_dump(release).splitlines()[0]}"] if release else []),
            "spec:",
            "  groups:",
            f"    - name: {GROUP}",
            f"      interval: {interval}",
            "      rules:",
        ]
        indent = 8
    else:
        raise ValueError(f"unknown format {fmt!r} (prometheus or prometheusrule)")
    for rule in translated:
        lines += [" " * indent + "# " + note for note in rule.notes]
        body = _dump([_rule_dict(rule)], indent)
        lines += body
    if monitor:
        lines.append(" " * indent + f"# The monitor's own liveness: a dead man's switch and "
                     f"rlmon's scrape target (job {job!r}; docs/liveness.md)")
        lines += _dump(monitor_rules(job), indent)
    return "\n".join(lines) + "\n"


def artifacts() -> list[Artifact]:
    return [
        Artifact(PROMETHEUS_RULES_PATH, lambda: render(fmt="prometheus")),
        Artifact(PROMETHEUSRULE_PATH, lambda: render(fmt="prometheusrule")),
    ]
