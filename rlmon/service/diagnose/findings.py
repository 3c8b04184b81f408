"""Findings: the alert rules and the sanity layer over a logged run, each with its context.

The rules are the service's (the default pack with its early-warning rules, or a team's own
pack, as ``rlmon replay --rules`` backtests it), run by the same engine in step order, so a
finding is what the service would have sent at that step. Each finding says where its condition
began (a ``for N`` rule fires N evaluated steps after), the value it fired on, how the value was
reduced by the framework that logged it, what the related metrics did in the steps around the
onset (the gradient norm and learning rate before a NaN, the KL and entropy around a clip-ratio
jump) and what to check.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, overload

import numpy as np

from rlmon.service.alerting import first_mover, sanity
from rlmon.service.alerting.engine import (
    AlertEngine,
    AlertEvent,
    evaluate_in_order,
)
from rlmon.service.alerting.projection import Projection
from rlmon.service.alerting.quiet_steps import evaluate_quietly
from rlmon.service.alerting.rules import (
    ANY_METRIC,
    LIVENESS_CONDITIONS,
    Condition,
    Rule,
    default_rules,
)
from rlmon.service.contract.step_record import StepRecord, json_number
from rlmon.service.diagnose import course, signatures
from rlmon.service.diagnose.columns import ColumnRows, RecordView
from rlmon.service.diagnose.cost import RunClock, SpanCost, no_clock, span_words
from rlmon.service.diagnose.logged_run import LoggedRun
from rlmon.service.diagnose.mapping import (
    KeyInfo,
    KeyMap,
    KeyStatus,
    map_keys,
    rlmon_key_map,
)
from rlmon.service.metrics import catalog as c
from rlmon.service.metrics import remedies
from rlmon.service.metrics.nonfinite import nonfinite_name
from rlmon.service.wording import format_value

__all__ = ["Diagnosis", "Finding", "Related", "diagnose", "to_records"]

ROLE = "trainer"  # a logged run is one stream, as the TRL integration reports it
_BEFORE = 3  # steps of context before the onset

# What to look at around each alert's onset, besides its own metric.
_RELATED: dict[str, tuple[str, ...]] = {
    "NonFiniteMetric": (c.GRAD_NORM, c.LR, c.LOSS, c.LOSS_SCALE, c.REWARD),
    "ClipRatioHigh": (c.KL, c.ENTROPY, c.APPROX_KL, c.LR),
    "ClipRatioClimbing": (c.KL, c.ENTROPY, c.APPROX_KL, c.LR),
    "EntropyCollapse": (c.KL, c.REWARD, c.CLIP_RATIO, c.RESPONSE_LENGTH, c.LR),
    "EntropySliding": (c.KL, c.REWARD, c.CLIP_RATIO, c.RESPONSE_LENGTH, c.LR),
    "KLDivergence": (c.ENTROPY, c.REWARD, c.CLIP_RATIO, c.LR),
    "KLClimbing": (c.ENTROPY, c.REWARD, c.CLIP_RATIO, c.LR),
    "GradNormHigh": (c.LR, c.LOSS, c.LOSS_SCALE, c.CLIP_RATIO),
    "GradNormBlowingUp": (c.LR, c.LOSS, c.LOSS_SCALE, c.CLIP_RATIO),
    "NoLearningSignal": (c.REWARD, c.REWARD_STD, c.RESPONSE_LENGTH, c.ENTROPY),
    "LearningSignalFading": (c.REWARD, c.REWARD_STD, c.RESPONSE_LENGTH, c.ENTROPY),
    "RewardStuck": (c.REWARD_STD, c.FRAC_REWARD_ZERO_STD, c.RESPONSE_LENGTH),
    "RewardCollapsing": (c.REWARD_STD, c.ENTROPY, c.KL, c.RESPONSE_LENGTH),
    "CompletionsTruncated": (c.RESPONSE_LENGTH, c.REWARD, c.ENTROPY),
    "ResponseLengthRunaway": (c.CLIPPED_RATIO, c.REWARD, c.ENTROPY),
    "RewardHacking": (c.RESPONSE_LENGTH, c.KL, c.VERIFIER_SCORE, c.ENTROPY, c.CLIPPED_RATIO),
}
_DEFAULT_RELATED = (c.GRAD_NORM, c.LR)
_TIES = "Every completion of a group scored alike: check the reward function (a constant, an " \
        "answer parser that fails on every output) and the prompts' difficulty."


@dataclass(frozen=True, slots=True)
class Related:
    """A related metric's values over the steps around an onset."""

    metric: str
    key: str  # as logged
    values: tuple[tuple[int, float], ...]

    def describe(self) -> str:
        shown = ", ".join(f"{step}: {format_value(v)}" for step, v in self.values)
        first, last = self.values[0][1], self.values[-1][1]
        trend = ""
        if math.isfinite(first) and math.isfinite(last) and len(self.values) > 1:
            if first and abs(last / first) >= 2:
                trend = f" (x{last / first:.3g})"
            elif last and abs(first / last) >= 2:
                trend = f" (/{first / last:.3g})"
        return f"{self.key}: {shown}{trend}"

    def to_json(self) -> dict[str, Any]:
        return {"metric": self.metric, "key": self.key,
                "values": [[s, json_number(v)] for s, v in self.values]}


@dataclass(frozen=True, slots=True)
class Finding:
    """An alert transition (or a sanity finding) with what explains it."""

    run: str
    role: str
    step: int
    alert: str
    severity: str
    state: str  # firing | resolved | found (sanity)
    metric: str
    key: str  # the metric as the run logged it
    value: float | None
    since: int | None = None  # the first step its condition held
    condition: str = ""
    what_to_check: str = ""
    value_is: str = ""  # the key's reduction and fidelity
    lossy: bool = False
    related: tuple[Related, ...] = ()
    detail: str = ""
    source: str = "rules"  # rules | sanity
    cost: SpanCost | None = None  # a firing's span: its steps' time and GPU-hours (.cost)
    # a firing that is a warning's escalation (the same incident, priced once with the warning)
    escalated_from: str = ""
    # a resolve because the rule's level rule fires now and judges the level (its name)
    handed_to: str = ""
    what_to_change: str = ""  # the framework's keys to move (rlmon.service.metrics.remedies)
    escalated_at: int | None = None  # a warning's firing: the step it escalated to critical
    first_moved: str = ""  # the related metric that left its baseline first, before the onset

    def to_json(self) -> dict[str, Any]:
        return {
            "type": "finding", "run": self.run, "role": self.role, "step": self.step,
            "alert": self.alert, "severity": self.severity, "state": self.state,
            "metric": self.metric, "key": self.key, "value": json_number(self.value),
            # the contract's name ("NaN", "Infinity", "-Infinity"), as every JSON output says it
            "nonfinite": nonfinite_name(self.value) or None,
            "since": self.since, "condition": self.condition, "value_is": self.value_is,
            "lossy": self.lossy, "detail": self.detail, "what_to_check": self.what_to_check,
            "related": [r.to_json() for r in self.related], "source": self.source,
            "cost": self.cost.to_json() if self.cost is not None else None,
            "escalated_from": self.escalated_from, "handed_to": self.handed_to,
            "what_to_change": self.what_to_change, "first_moved": self.first_moved,
            "escalated_at": self.escalated_at, "severity_now": self.severity_now,
        }

    @property
    def severity_now(self) -> str:
        """The incident's severity at its end: a warning that escalated is critical."""
        return "critical" if self.escalated_at is not None else self.severity


@dataclass(frozen=True, slots=True)
class Diagnosis:
    run: LoggedRun
    keymap: KeyMap
    findings: tuple[Finding, ...]
    # every step with its events (a long log's records built as they are looked at)
    steps: Sequence[tuple[StepRecord, Sequence[AlertEvent]]] = ()
    lossy_keys: tuple[str, ...] = ()  # the sanity layer's word on each lossy relayed key
    no_known_keys: bool = False
    clock: RunClock | None = None  # step times, GPUs and price, from what the files carry
    projections: tuple[Projection, ...] = ()  # where metrics were heading at the run's end
    # without a clock: why nothing is priced, said once ("" when priced)
    unpriced: str = ""

    def worst(self) -> str | None:
        severities = {f.severity for f in self.findings if f.state != "resolved"}
        return next((s for s in ("critical", "warning") if s in severities), None)

    def to_json(self) -> dict[str, Any]:
        run = self.run
        return {
            "type": "source", "source": run.source, "format": run.format, "run": run.name,
            "steps": run.steps, "framework": self.keymap.framework,
            "framework_how": self.keymap.how,
            "keys": [k.to_json() for k in self.keymap.keys], "notes": list(run.notes),
            "lossy_keys": list(self.lossy_keys), "findings": len(self.findings),
            "settings": [{"from_step": seg.first_step, "file": seg.source,
                          **seg.settings.to_json()} for seg in run.segments],
            "cost": self.clock.to_json() if self.clock is not None else None,
            "unpriced": self.unpriced,
            "projections": [p.to_json(self.seconds_per_step) for p in self.projections],
        }

    @property
    def seconds_per_step(self) -> float | None:
        return self.clock.seconds_per_step if self.clock is not None else None


def to_records(run: LoggedRun, keymap: KeyMap) -> Sequence[StepRecord]:
    """The run's steps as step records under the mapped names (one stream per run); a long
    log's (:class:`ColumnRows`) are built one at a time as they are looked at."""
    if run.records:
        return list(run.records)
    names = {info.key: info.name for info in keymap.keys if info.name}
    if isinstance(run.rows, ColumnRows):
        return RecordView(run.rows, names, run.name, ROLE)
    return [
        StepRecord(run=run.name, role=ROLE, step=step, complete=True, ranks_expected=1,
                   ranks_reporting=1, missing_ranks=(),
                   metrics={names[k]: v for k, v in values.items() if k in names})
        for step, values in run.rows.items()
    ]


def _stream(steps: Sequence[tuple[StepRecord, Any]], run: str, role: str) -> list[StepRecord]:
    return [r for r, _ in steps if r.run == run and r.role == role]


def _index_after(stream: Sequence[StepRecord], step: int) -> int:
    """The index of the first record after ``step`` (a log's view looks it up)."""
    if isinstance(stream, RecordView):
        return stream.index_after(step)
    return next((i for i, r in enumerate(stream) if r.step > step), len(stream))


def _since(stream: Sequence[StepRecord], event: AlertEvent, rule: Rule | None) -> int | None:
    """The first step of the run of steps (holding the metric) the rule needed to fire; for a
    warning's escalation at its critical level, the step the level was first crossed (the
    escalation's own step: it is judged at every firing step), and for a warning past its
    critical level at once, the first of those steps past it."""
    if rule is None or event.state != "firing":
        return None
    if event.escalated_from:  # judged at every firing step: here, or pinned since
        if rule.critical_pinned is None or event.value is None:
            return event.step
        index = _index_after(stream, event.step) - 1
        since = event.step
        while index >= 0 and stream[index].metrics.get(event.metric) == event.value:
            since = stream[index].step
            index -= 1
        return since
    need = rule.for_steps
    if isinstance(stream, RecordView):  # in step order: walk back from the firing step
        holding: list[int] = []
        index = stream.index_after(event.step) - 1
        while index >= 0 and len(holding) < need:
            record = stream[index]
            if not event.metric or event.metric in record.metrics:
                holding.insert(0, record.step)
            index -= 1
    else:
        holding = [r.step for r in stream if r.step <= event.step
                   and (not event.metric or event.metric in r.metrics)]
    if len(holding) < need:
        return event.step
    since = holding[-need]
    if event.severity != rule.severity.value and rule.critical is not None:
        since = event.step  # the steps up to it past the critical level, in a row
        for step in reversed(holding[-need:]):
            if not rule.crosses_critical(_value_at(stream, step, event.metric)):
                break
            since = step
    return since


def _value_at(stream: Sequence[StepRecord], step: int, metric: str) -> float | None:
    record = _at_step(stream, step)
    return None if record is None else record.metrics.get(metric)


def _related(stream: Sequence[StepRecord], event: AlertEvent, since: int | None,
             keymap: KeyMap) -> tuple[Related, ...]:
    onset = since if since is not None else event.step
    index = _index_after(stream, onset - 1)
    if index >= len(stream):
        index = 0
    end = _index_after(stream, event.step)
    window = stream[max(0, index - _BEFORE):max(end, index + 1)]
    keys = {info.name: info.key for info in keymap.keys if info.name}
    out = []
    metrics = (event.metric, *_RELATED.get(event.alert, _DEFAULT_RELATED))
    for metric in dict.fromkeys(m for m in metrics if m):
        values = tuple((r.step, r.metrics[metric]) for r in window if metric in r.metrics)
        if values:
            out.append(Related(metric, keys.get(metric, metric), values))
    return tuple(out)


def _detail(stream: Sequence[StepRecord], event: AlertEvent) -> str:
    if event.alert != "NonFiniteMetric" or event.state != "firing":
        return ""
    if isinstance(stream, RecordView):
        at = stream.index_after(event.step) - 1
        record = stream[at]
        earlier = [stream[at - 1]] if at > 0 else []
    else:
        record = next(r for r in stream if r.step == event.step)
        earlier = [r for r in stream if r.step < event.step]
    bad = sorted(n for n, v in record.metrics.items() if not math.isfinite(v))
    text = f"non-finite at step {event.step}: {', '.join(bad)}"
    if earlier:
        text += f"; every metric was finite at step {earlier[-1].step}"
    return text


_EXPLODED = 10.0  # a gradient norm this many times its earlier level before a NaN: an explosion


def _earlier(stream: Sequence[StepRecord], metric: str, step: int) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of ``metric``'s finite values before ``step``, in step order."""
    if isinstance(stream, RecordView):
        values, present = stream.column(metric)
        steps = stream.steps()
        keep = present & np.isfinite(values) & (steps < step)
        return steps[keep], values[keep]
    pairs = [(r.step, r.metrics[metric]) for r in stream
             if r.step < step and metric in r.metrics and math.isfinite(r.metrics[metric])]
    return np.array([s for s, _ in pairs], dtype=np.int64), np.array([v for _, v in pairs])


def _non_finite_hint(stream: Sequence[StepRecord], event: AlertEvent,
                     related: tuple[Related, ...]) -> str:
    """Whether the gradient norm before a NaN had exploded: rising into it, or held far above
    the run's earlier level (an explosion that went on for a while before the NaN is still
    one), or calm (then the NaN came in with an input)."""
    grad = next((r for r in related if r.metric == c.GRAD_NORM), None)
    before = [v for s, v in grad.values if s < event.step] if grad else []
    if not before or not math.isfinite(before[-1]):
        return ("A value became NaN or Inf: check the rewards and advantages fed to the loss, "
                "the learning rate and the loss scale.")
    last = before[-1]
    text = f"The gradient norm before it was {format_value(last)}"
    if len(before) > 1 and last > 2 * before[0]:
        return text + (" and rising: an explosion; lower the learning rate, clip gradients, "
                       "check the loss scale.")
    steps, values = _earlier(stream, c.GRAD_NORM, event.step)
    # the run's earlier level: the first half of its finite values, before any trouble
    half = max(1, len(values) // 2)
    level = float(np.median(values[:half])) if len(values) else last
    if level > 0 and last >= _EXPLODED * level:
        high = values >= _EXPLODED * level
        start = len(high) - int(np.argmin(high[::-1])) if not high.all() else 0
        return text + (f", {last / level:.3g}x its earlier level ({format_value(level)}, the median of "
                       f"steps {steps[0]}-{steps[half - 1]}) and that high since step "
                       f"{steps[start]}: it had exploded before the NaN; lower the learning "
                       "rate, clip gradients, check the loss scale.")
    return text + (f", not exploding (its earlier level: {format_value(level)}): look for a NaN input "
                   "instead (a reward, an advantage over a group of one, a log of zero, a "
                   "corrupt reference model).")


def _hint(stream: Sequence[StepRecord], event: AlertEvent, related: tuple[Related, ...]) -> str:
    """What to check, from the catalog, sharpened by the context where it tells more."""
    hint = event.what_to_check
    if event.alert == "NonFiniteMetric":
        hint = _non_finite_hint(stream, event, related)
    elif event.alert in ("NoLearningSignal", "LearningSignalFading") and not hint:
        hint = _TIES
    return hint


def diagnose(run: LoggedRun, rules: Sequence[Rule] | None = None,
             framework: str | None = None, gpus: float | None = None,
             price: float | None = None) -> Diagnosis:
    """Map the run's keys, evaluate the rules and the sanity layer step by step; price each
    finding's span with the run's step times (``gpus``: else the world size its settings read;
    ``price``: per GPU-hour) and project where its metrics were heading."""
    keys = run.keys
    keymap = rlmon_key_map(keys) if run.records else map_keys(keys, framework, run.framework)
    rules = default_rules() if rules is None else list(rules)
    by_rule = {r.name: r for r in rules}
    records = to_records(run, keymap)
    steps: Sequence[tuple[StepRecord, Sequence[AlertEvent]]]
    streams: dict[tuple[str, str], Sequence[StepRecord]] = {}
    with_events: list[tuple[StepRecord, Sequence[AlertEvent]]]
    if isinstance(records, RecordView):  # a long log: one stream, in step order, built lazily
        mapped = set(keymap.by_name())
        engine = AlertEngine([r for r in rules if _can_apply(r, mapped)])
        evented = [(i, tuple(e)) for i, e in evaluate_quietly(engine, records)]
        steps = LoggedSteps(records, dict(evented))
        with_events = [(records[i], e) for i, e in evented]
        streams[(run.name, ROLE)] = records
    else:
        steps = evaluate_in_order(AlertEngine(rules), records)
        with_events = [(r, e) for r, e in steps if e]
    names = keymap.by_name()
    findings: list[Finding] = []
    for _, events in with_events:
        for event in events:
            if event.repeat:  # a firing alert's heading stated anew: its finding's, not one more
                _restated(findings, event)
                continue
            stream = streams.get((event.run, event.role))
            if stream is None:
                stream = streams[(event.run, event.role)] = _stream(steps, event.run, event.role)
            since = _since(stream, event, by_rule.get(event.alert))
            related = _related(stream, event, since, keymap) if event.state == "firing" else ()
            info = names.get(event.metric)
            findings.append(Finding(
                event.run, event.role, event.step, event.alert, event.severity, event.state,
                event.metric, info.key if info else event.metric, event.value, since,
                event.condition,
                _hint(stream, event, related) if event.state == "firing" and not event.escalated_from
                else "",
                info.describe() if info else "", bool(info and info.lossy), related,
                _detail(stream, event) or event.detail, escalated_from=event.escalated_from,
                handed_to=event.handed_to,
                what_to_change=remedies.remedy_text(event.alert, keymap.framework)
                if event.state == "firing" and not event.escalated_from else "",
                first_moved=_first_moved(stream, event)))
    findings = _escalations(findings)
    findings.extend(_sanity(records, keymap, run))
    if not run.records:
        findings.extend(_gaps(run, keymap))
    findings.sort(key=lambda f: (f.run, f.role, f.step, f.source != "rules"))
    lossy = tuple(w.message for w in sanity.relay_warnings(
        keymap.framework, [i.key.removeprefix("train/") for i in keymap.keys])) \
        if keymap.framework else ()
    known = any(info.status in (KeyStatus.CANONICAL, KeyStatus.RELAYED) for info in keymap.keys)
    if not isinstance(steps, LoggedSteps):
        steps = tuple((r, tuple(e)) for r, e in steps)
    clock = course.clock_of(run, keymap, gpus, price)
    return Diagnosis(run, keymap, tuple(_priced(findings, clock)), steps, lossy,
                     not known, clock, tuple(course.projections(records, rules)),
                     "" if clock is not None else no_clock(gpus, price))


def _restated(findings: list[Finding], event: AlertEvent) -> None:
    """Add what a firing alert stated again while it held (where its metric is heading now,
    rlmon.service.alerting.heading) to its open finding's detail, with the step."""
    for index in range(len(findings) - 1, -1, -1):
        f = findings[index]
        if (f.run, f.role, f.alert) == (event.run, event.role, event.alert):
            if f.state == "firing" and event.detail:
                findings[index] = replace(f, detail="; ".join(filter(None, (
                    f.detail, f"at step {event.step}: {event.detail}"))))
            return


def _first_moved(stream: Sequence[StepRecord], event: AlertEvent) -> str:
    """Which related metric left its baseline first before a firing (the service's
    :mod:`rlmon.service.alerting.first_mover`, over the log's steps up to it)."""
    if event.state != "firing" or event.escalated_from or event.alert not in first_mover.RELATED:
        return ""
    end = _index_after(stream, event.step)
    start = max(0, end - first_mover.LOOKBACK - first_mover.BASELINE - 1)
    history: dict[str, list[tuple[int, float]]] = {}
    for record in stream[start:end]:
        for name, value in record.metrics.items():
            if name in first_mover.TRACKED:
                history.setdefault(name, []).append((record.step, value))
    return first_mover.first_moved(event.alert, history, event.step)


def _escalations(findings: list[Finding]) -> list[Finding]:
    """Each warning's firing marked with the step it escalated at (one incident: the
    escalation is the same alert's firing before its resolve)."""
    open_: dict[tuple[str, str, str], int] = {}
    out = list(findings)
    for index, f in enumerate(out):
        key = (f.run, f.role, f.alert)
        if f.state == "firing" and not f.escalated_from:
            open_[key] = index
        elif f.state == "firing" and key in open_:
            out[open_[key]] = replace(out[open_[key]], escalated_at=f.step)
        elif f.state == "resolved":
            open_.pop(key, None)
    return out


def _priced(findings: Sequence[Finding], clock: RunClock | None) -> list[Finding]:
    """Each firing with the cost of its span: from the step its condition began to the step
    before it resolved (the run's last step while it never did). A warning's escalation is the
    same incident: its cost is the warning's, counted there once."""
    if clock is None or clock.last_step is None:
        return list(findings)
    end_of_run = clock.last_step
    out = []
    for index, finding in enumerate(findings):
        if finding.state != "firing" or finding.escalated_from:
            out.append(finding)
            continue
        resolved = next((f.step for f in findings[index + 1:] if f.state == "resolved"
                         and (f.run, f.role, f.alert) == (finding.run, finding.role,
                                                          finding.alert)), None)
        first = finding.since if finding.since is not None else finding.step
        last = end_of_run if resolved is None else max(first, resolved - 1)
        out.append(replace(finding, cost=clock.span(first, last, span_words(finding.alert))))
    return out


def _can_apply(rule: Rule, metrics: set[str]) -> bool:
    """Whether a rule can judge any step of a log holding ``metrics``: a rule on one metric the
    log never has, or judged by time (a log has no heartbeats), is never applicable (the engine
    would skip it at every step; left out, a million-step log is evaluated sooner)."""
    if rule.condition in LIVENESS_CONDITIONS:
        return False
    if rule.metric == ANY_METRIC or rule.condition not in _ONE_METRIC:
        return True
    return rule.metric in metrics


_ONE_METRIC = frozenset({Condition.THRESHOLD, Condition.OUTSIDE, Condition.BASELINE,
                         Condition.STUCK, Condition.TREND, Condition.NON_FINITE})


class LoggedSteps(Sequence[tuple[StepRecord, Sequence[AlertEvent]]]):
    """A long log's evaluated steps: its records built when looked at, the events kept."""

    def __init__(self, records: RecordView, events: dict[int, tuple[AlertEvent, ...]]) -> None:
        self._records = records
        self._events = events

    @overload
    def __getitem__(self, index: int) -> tuple[StepRecord, Sequence[AlertEvent]]: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[tuple[StepRecord, Sequence[AlertEvent]]]: ...

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        return self._records[index], self._events.get(index, ())

    def __iter__(self) -> Iterator[tuple[StepRecord, Sequence[AlertEvent]]]:
        for index, record in enumerate(self._records):
            yield record, self._events.get(index, ())

    def __len__(self) -> int:
        return len(self._records)

    @property
    def records(self) -> RecordView:
        """The records, as the columns' view (``diagnose --html`` reads its columns)."""
        return self._records

    @property
    def events(self) -> list[AlertEvent]:
        """Every alert event, in step order."""
        return [event for index in sorted(self._events) for event in self._events[index]]


_DPO_KEYS = frozenset({"rewards/chosen", "rewards/rejected", "rewards/margins"})


def _is_dpo(keymap: KeyMap) -> bool:
    """TRL's DPOTrainer logs the implicit rewards of the chosen and rejected answers."""
    bare = {info.key.removeprefix("train/") for info in keymap.keys}
    return _DPO_KEYS.issubset(bare)


def _at_step(ordered: Sequence[StepRecord], step: int) -> StepRecord | None:
    """The (last) record of ``step``."""
    if isinstance(ordered, RecordView):
        index = ordered.index_after(step) - 1
        return ordered[index] if index >= 0 and ordered[index].step == step else None
    return {r.step: r for r in ordered}.get(step)


def _sanity(records: Sequence[StepRecord], keymap: KeyMap, run: LoggedRun) -> list[Finding]:
    names = keymap.by_name()
    checkers: dict[tuple[str, str], sanity.SanityChecker] = {}
    # the run's metadata as the service would have it from set_run_info, built the same way
    meta = run.settings.to_run_info(keymap.framework or "", _is_dpo(keymap),
                                    run.packages.get("deepspeed", ""))
    dpo, deepspeed = sanity.checker_args(meta)
    ordered = records if isinstance(records, RecordView) else \
        sorted(records, key=lambda r: r.identity)
    observed: Iterable[StepRecord] = ordered
    if isinstance(ordered, RecordView):  # a long log: only the steps where a check can act
        probe = sanity.SanityChecker(dpo=dpo, deepspeed_version=deepspeed)
        observed = (ordered[i] for i in np.flatnonzero(probe.may_act(ordered.column)).tolist())
    found_at = [(r, f) for r in observed for f in _observe(checkers, r, dpo, deepspeed)]
    for found in signatures.scaling_signatures(run, ordered):
        record = _at_step(ordered, found.step if found.step is not None else -1)
        if record is not None:
            found_at.append((record, found))
    out = []
    for record, found in found_at:
        info = names.get(found.metric)
        out.append(Finding(
            record.run, record.role, record.step, found.kind.value, found.severity,
            "found", found.metric, info.key if info else found.metric,
            record.metrics.get(found.metric, run.rows.get(record.step, {}).get(found.metric)),
            what_to_check=found.message, value_is=info.describe() if info else "",
            lossy=bool(info and info.lossy), source="sanity"))
    return out


def _observe(checkers: dict[tuple[str, str], sanity.SanityChecker], record: StepRecord,
             dpo: bool, deepspeed: str | None) -> list[sanity.Finding]:
    checker = checkers.setdefault((record.run, record.role), sanity.SanityChecker(
        dpo=dpo, deepspeed_version=deepspeed))
    return checker.observe(record.step, record.metrics)


_STEADY = 3  # steps a key must have been logged in a row before its absence is news
_GAP_HINT = ("It was logged at every step before this one, and this step's other metrics "
             "were: a tracker leaves out a value it cannot write. TRL logs a metric whose every "
             "value was NaN as None, which TensorBoard drops and trainer_state.json holds as "
             "null: look for a NaN at this step (the rewards, the reference model, the loss).")


def _gaps(run: LoggedRun, keymap: KeyMap) -> list[Finding]:
    """A known key logged at every step, then missing at a step whose other steady keys are
    there (unknown keys are left out: a profiling timer logged once per phase is no signal)."""
    watched = {i.key: i for i in keymap.keys
               if i.status in (KeyStatus.CANONICAL, KeyStatus.RELAYED)}
    if isinstance(run.rows, ColumnRows):
        return _gaps_by_column(run, run.rows, watched)
    streak: dict[str, int] = {}
    since: dict[str, int] = {}
    said: set[str] = set()
    out = []
    for step, values in run.rows.items():
        steady = {k for k, n in streak.items() if n >= _STEADY}
        missing = sorted(k for k in steady if k not in values)
        if missing and len(steady) - len(missing) >= len(missing):
            for key in missing:
                if key in said:
                    continue
                said.add(key)
                info = watched[key]
                out.append(Finding(
                    run.name, ROLE, step, "MetricNotLogged", "warning", "found", info.name, key,
                    None, since=since[key], condition=f"{key} logged at every step from "
                    f"{since[key]}, not at {step}", what_to_check=_GAP_HINT,
                    value_is=info.describe(), lossy=info.lossy, source="diagnose"))
        for key in watched:
            if key in values:
                if streak.get(key, 0) == 0:
                    since[key] = step
                streak[key] = streak.get(key, 0) + 1
            else:
                streak[key] = 0
    return out



def _gaps_by_column(run: LoggedRun, rows: ColumnRows, watched: dict[str, KeyInfo],
                    ) -> list[Finding]:
    """:func:`_gaps` over a long log's columns: per key, the steps it had been logged at in a
    row before each step, in numpy; only the steps where a steady key is missing are looked at
    one by one (the same findings, tested against the step-by-step walk)."""
    size = len(rows)
    index = np.arange(size)
    run_before: dict[str, np.ndarray] = {}  # steps in a row the key was logged, before each
    missing: dict[str, np.ndarray] = {}
    steady_count = np.zeros(size, dtype=np.int64)
    missing_count = np.zeros(size, dtype=np.int64)
    for key in watched:
        logged = rows.logged(key)
        last_gap = np.maximum.accumulate(np.where(logged, -1, index))
        before = np.zeros(size, dtype=np.int64)
        before[1:] = (index - last_gap)[:-1]  # the run ending at the step before
        steady = before >= _STEADY
        run_before[key], missing[key] = before, steady & ~logged
        steady_count += steady
        missing_count += missing[key]
    news = (missing_count > 0) & (steady_count - missing_count >= missing_count)
    said: set[str] = set()
    out = []
    for at in np.flatnonzero(news).tolist():
        step = rows.step_at(at)
        for key in sorted(k for k in missing if missing[k][at] and k not in said):
            said.add(key)
            info = watched[key]
            since = rows.step_at(at - int(run_before[key][at]))
            out.append(Finding(
                run.name, ROLE, step, "MetricNotLogged", "warning", "found", info.name, key,
                None, since=since, condition=f"{key} logged at every step from "
                f"{since}, not at {step}", what_to_check=_GAP_HINT,
                value_is=info.describe(), lossy=info.lossy, source="diagnose"))
        if len(said) == len(watched):
            break
    return out
