"""The run report: a run's health in one place, built offline from the history store.

:func:`build_report` reads the store (no service, no Ray) and returns a :class:`RunReport`:
the steps and attempts of each role, every alert with its onset, resolve and cost, goodput by
bucket over the run and step by step (the same accounting the live service runs, on every
role's timelines at once), the slowest ranks and stages, the worst samples behind each alert,
and the key curves with alert markers. :mod:`rlmon.service.report.text` and
:mod:`rlmon.service.report.html` render it; ``to_json`` is ``rlmon report --json``.
"""

from __future__ import annotations

import math
import sqlite3
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from statistics import median
from typing import Any

from rlmon.service.config import GoodputConfig
from rlmon.service.goodput.accounting import (
    GoodputTotals,
    RoleTimelines,
    StepGoodput,
    StepInput,
    account_step,
    busy_seconds,
    mfu,
)
from rlmon.service.goodput.buckets import Bucket, SpanMap
from rlmon.service.goodput.cost import Price, alert_cost
from rlmon.service.goodput.ledger import discard_reason, gpus_per_rank, span_map
from rlmon.service.metrics import catalog
from rlmon.service.metrics.nonfinite import nonfinite_name, nonfinite_value
from rlmon.service.storage.history import HistoryStore, StepTimelines
from rlmon.service.storage.stored_samples import items_to_json

__all__ = ["KEY_METRICS", "MAX_CURVE_POINTS", "AlertEntry", "Curve", "RoleSummary", "RunReport",
           "build_report", "curve_metrics", "curves_from", "thinning_width"]

# The curves every report draws when the run has them (then the alerts' own metrics).
KEY_METRICS = (
    catalog.IS_RATIO, catalog.LOGP_DIFF, catalog.KL, catalog.ENTROPY, catalog.CLIP_RATIO,
    catalog.REWARD, catalog.FRAC_REWARD_ZERO_STD, catalog.STEP_SECONDS,
)
_SAMPLES_SHOWN = 5
_TOP = 10


@dataclass(frozen=True, slots=True)
class RoleSummary:
    role: str
    steps: int
    first: int
    last: int
    incomplete: int  # steps finalized without every expected rank
    attempts: int
    ranks: int  # expected ranks of the latest step


@dataclass(frozen=True, slots=True)
class AlertEntry:
    """One incident: an alert from firing to resolve (None: still firing at the end)."""

    role: str
    alert: str
    severity: str
    metric: str
    attempt: int
    fired_step: int
    value: float | None
    resolved_step: int | None
    onset: float | None  # unix seconds: the first step the condition held
    gpus: float | None
    gpu_hours: float | None
    money: float | None
    cost_note: str | None  # None: the store kept no cost for it (said "cost unknown")
    samples_metric: str = ""
    samples: tuple[dict[str, Any], ...] = ()
    # the step a warning escalated to critical at (issue 30: the same incident, its severity
    # then the escalation's); None where it did not
    escalated_step: int | None = None
    # closed because the run ended with it firing (AlertEvent.ended_with_run): never "resolved"
    ended_with_run: bool = False
    # an early warning closed because its level rule fires now (AlertEvent.handed_to): the
    # condition goes on under that rule's name, so never "resolved" either
    handed_to: str = ""


@dataclass(frozen=True, slots=True)
class Curve:
    """One metric of one role over the steps, and the alert transitions on that role."""

    role: str
    metric: str
    points: tuple[tuple[int, float], ...]
    markers: tuple[tuple[int, str, str], ...]  # (step, alert, firing|resolved)


@dataclass(frozen=True, slots=True)
class RunReport:
    run: str
    generated_at: float
    roles: tuple[RoleSummary, ...]
    alerts: tuple[AlertEntry, ...]
    goodput: Mapping[str, float]  # bucket -> GPU-seconds, over the run
    goodput_reasons: tuple[tuple[str, str, float], ...]  # (bucket, reason, GPU-seconds)
    goodput_ratio: float
    gpu_hours: float
    steps_accounted: int
    goodput_steps: tuple[tuple[int, int, Mapping[str, float]], ...]  # (attempt, step, buckets)
    unmapped_spans: tuple[str, ...]
    slowest_ranks: tuple[dict[str, Any], ...]
    slowest_stages: tuple[dict[str, Any], ...]
    curves: tuple[Curve, ...]
    mfu: float | None = None
    price_per_gpu_hour: float | None = None
    currency: str = "USD"
    notes: tuple[str, ...] = field(default=())
    # each role's liveness state as the service last saw it: running, slow, stalled, frozen,
    # dead, failed, preempted, finished (docs/liveness.md), with since and where / how it ended
    run_states: tuple[dict[str, Any], ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["curves"] = [{"role": c.role, "metric": c.metric,
                           "points": [list(p) for p in c.points],
                           "markers": [list(m) for m in c.markers]} for c in self.curves]
        data["goodput_steps"] = [{"attempt": a, "step": s, "seconds": dict(b)}
                                 for a, s, b in self.goodput_steps]
        for entry, alert in zip(data["alerts"], self.alerts, strict=True):
            # JSON has no NaN: a non-finite value is null, and this says which it was
            entry["nonfinite"] = nonfinite_name(alert.value)
        return _finite(data)


def _finite(value: Any) -> Any:
    """JSON has no NaN: non-finite numbers become None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _roles(lines: Sequence[Mapping[str, Any]]) -> tuple[RoleSummary, ...]:
    """Per role, in one pass holding a summary, not the lines (a million steps)."""
    by_role: dict[str, RoleSummary] = {}
    for line in lines:
        role, step, attempt = line["role"], int(line["step"]), int(line.get("attempt", 0))
        was = by_role.get(role)
        incomplete = 0 if line["complete"] else 1
        by_role[role] = RoleSummary(
            role, 1, step, step, incomplete, 1 + attempt, int(line["ranks_expected"])
        ) if was is None else RoleSummary(
            role, was.steps + 1, min(was.first, step), max(was.last, step),
            was.incomplete + incomplete, max(was.attempts, 1 + attempt),
            int(line["ranks_expected"]))
    return tuple(by_role[role] for role in sorted(by_role))


def _alerts(store: HistoryStore, run: str, run_end: float | None, price: Price,
            ) -> tuple[AlertEntry, ...]:
    """Every incident, firing to resolve. One still firing at the end costs, so far, the run's
    GPUs from its onset to the end of the run's last step, or to when it fired where that is
    later (a stall, a dead run: time-based alerts fire after the last step)."""
    open_: dict[tuple[str, str, int], dict[str, Any]] = {}
    escalated: dict[int, dict[str, Any]] = {}  # id(first firing row) -> its escalation's row
    done: list[tuple[dict[str, Any], dict[str, Any] | None]] = []
    for row in store.alerts(run, cost=True):
        key = (row["role"], row["alert"], int(row["attempt"] or 0))
        if row["state"] == "firing":
            if key in open_:  # a firing while open is its escalation: the same incident
                escalated[id(open_[key])] = row
            else:
                open_[key] = row
        elif key in open_:
            done.append((open_.pop(key), row))
    done.extend((row, None) for row in open_.values())
    out = []
    for fired, resolved in sorted(done, key=lambda p: (p[0]["step"], p[0]["alert"])):
        escalation = escalated.get(id(fired))
        # the resolve carries the whole incident's cost, else the escalation (the cost so far)
        latest = resolved or escalation or fired
        gpu_hours, money, note = latest["gpu_hours"], latest["money"], latest["cost_note"]  # None: not kept
        if resolved is None and fired["onset"] is not None and fired["gpus"]:
            # to the run's last step, or to when it fired if that was later (a stall fires
            # after the last step: its firing row's cost is a floor)
            fired_at = fired["onset"] + (fired["gpu_hours"] or 0.0) * 3600.0 / fired["gpus"]
            end = max(run_end if run_end is not None else fired_at, fired_at)
            cost = alert_cost(fired["onset"], end, fired["gpus"], price)
            gpu_hours, money = cost.gpu_hours, cost.money
            note = cost.describe("firing") + (" (to the run's last step)" if end == run_end
                                              else " (when it fired; still firing)")
        name = catalog.samples_for(fired["metric"]) if fired["metric"] else None
        samples: tuple[dict[str, Any], ...] = ()
        if name:
            stored = store.samples(run, fired["role"], fired["step"], name,
                                   int(fired["attempt"] or 0))
            if stored:
                samples = tuple(items_to_json(stored[0].items[:_SAMPLES_SHOWN]))
        out.append(AlertEntry(
            fired["role"], fired["alert"],
            (escalation or fired)["severity"], fired["metric"],
            int(fired["attempt"] or 0), int(fired["step"]),
            nonfinite_value(fired["value"], fired.get("nonfinite")),
            int(resolved["step"]) if resolved else None, fired["onset"], latest["gpus"],
            gpu_hours, money, note,
            name or "" if samples else "", samples,
            int(escalation["step"]) if escalation else None,
            bool(resolved and resolved.get("ended_with_run")),
            str(resolved.get("handed_to") or "") if resolved else ""))
    return tuple(out)


def _fractions(lines: Sequence[Mapping[str, Any]]) -> dict[tuple[int, int], dict[str, float]]:
    out: dict[tuple[int, int], dict[str, float]] = {}
    for line in lines:
        metrics = {k: float(v) for k, v in line["metrics"].items() if v is not None}
        out.setdefault((int(line.get("attempt", 0)), int(line["step"])), {}).update(metrics)
    return out


def _discards(lines: Sequence[Mapping[str, Any]]) -> dict[tuple[int, int], str]:
    """(attempt, step) -> why its work was thrown away (a skipped optimizer step)."""
    out: dict[tuple[int, int], str] = {}
    before: dict[tuple[str, int], float] = {}
    for line in lines:  # (role, attempt, step) order
        metrics = {k: float(v) for k, v in line["metrics"].items() if v is not None}
        key = (line["role"], int(line.get("attempt", 0)))
        why = discard_reason(metrics, before.get(key))
        if why:
            out[(key[1], int(line["step"]))] = why
        if catalog.SKIPPED_STEPS in metrics:
            before[key] = metrics[catalog.SKIPPED_STEPS]
    return out


def _goodput(store: HistoryStore, run: str, lines: Sequence[Mapping[str, Any]],
             config: GoodputConfig) -> tuple[list[StepGoodput], list[StepTimelines]]:
    spans = span_map(config)
    stored = store.timelines(run, every_attempt=True)
    if not stored:  # no timelines, no goodput: the steps' values are not needed
        return [], stored
    by_step: dict[tuple[int, int], list[RoleTimelines]] = {}
    for st in stored:
        by_step.setdefault((st.attempt, st.step), []).append(
            RoleTimelines(st.role, st.ranks, gpus_per_rank(config, st.role)))
    values = _fractions(lines)
    discarded = _discards(lines)
    restarts: dict[int, int] = {}  # attempt -> the first step of the next attempt
    for attempt, step in sorted(by_step):
        if attempt > 0:
            restarts[attempt - 1] = min(restarts.get(attempt - 1, step), step)
    out = []
    for (attempt, step), roles in sorted(by_step.items()):
        metrics = values.get((attempt, step), {})
        neighbours = [*by_step.get((attempt, step - 1), ()), *by_step.get((attempt, step + 1), ())]
        out.append(account_step(StepInput(
            run, attempt, step, tuple(roles), metrics.get(catalog.FRAC_REWARD_ZERO_STD),
            metrics.get(catalog.CLIPPED_RATIO), discarded.get((attempt, step), ""),
            tuple(neighbours), rolled_back=step >= restarts.get(attempt, math.inf)), spans))
    return out, stored


def _slowest(stored: Sequence[StepTimelines], spans: SpanMap,
             ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The ranks most often the slowest of their role's step (by time in classified spans: a
    ``step`` container is not work) and the spans that took the most time per rank."""
    ranks: dict[tuple[str, tuple[int, ...]], list[float]] = {}
    stages: dict[tuple[str, str], list[float]] = {}
    for st in stored:
        busy = [busy_seconds(rt.timeline, spans) for rt in st.ranks]
        typical = median(busy) if len(busy) > 1 else 0.0
        if typical > 0:
            slow = max(range(len(busy)), key=lambda i: (busy[i], -i))
            ranks.setdefault((st.role, tuple(st.ranks[slow].rank)), []).append(
                busy[slow] / typical)
        per_name: dict[str, float] = {}
        for rt in st.ranks:
            for span in rt.timeline.spans:
                per_name[span.name] = per_name.get(span.name, 0.0) + span.seconds
        for name, seconds in per_name.items():
            stages.setdefault((st.role, name), []).append(seconds / max(len(st.ranks), 1))
    top_ranks = sorted(ranks.items(), key=lambda kv: (-len(kv[1]), -median(kv[1])))[:_TOP]
    slow_ranks = [{"role": role, "rank": dict(zip(("dp", "cp", "tp", "pp"), rank, strict=True)),
                   "times_slowest": len(r), "median_ratio": median(r), "max_ratio": max(r)}
                  for (role, rank), r in top_ranks]
    top_stages = sorted(stages.items(), key=lambda kv: -sum(kv[1]))[:_TOP]
    slow_stages = [{"role": role, "span": name, "steps": len(v), "mean_seconds": sum(v) / len(v),
                    "max_seconds": max(v), "total_seconds": sum(v)}
                   for (role, name), v in top_stages]
    return slow_ranks, slow_stages


MAX_CURVE_POINTS = 2_000


class _Thinned:
    """A curve's points, at most about ``2 * MAX_CURVE_POINTS`` of them: each run of ``width``
    consecutive points keeps its lowest and its highest (a spike or a dip stays visible), in
    step order. A million-step run draws as a few thousand points, in memory to match."""

    def __init__(self, width: int) -> None:
        self.width = width
        self.points: list[tuple[int, float]] = []
        self._low: tuple[int, float] | None = None
        self._high: tuple[int, float] | None = None
        self._seen = 0

    def add(self, step: int, value: float) -> None:
        if self.width == 1:
            self.points.append((step, value))
            return
        if self._low is None or value < self._low[1]:
            self._low = (step, value)
        if self._high is None or value > self._high[1]:
            self._high = (step, value)
        self._seen += 1
        if self._seen == self.width:
            self.close()

    def close(self) -> list[tuple[int, float]]:
        if self._low is not None and self._high is not None:
            self.points.extend(sorted({self._low, self._high}))
        self._low = self._high = None
        self._seen = 0
        return self.points


def thinning_width(lines: int) -> int:
    """How many consecutive points of a curve of ``lines`` steps become one low and one high."""
    return max(1, -(-lines // MAX_CURVE_POINTS))


def curve_metrics(alerts: Sequence[AlertEntry]) -> list[str]:
    """The metrics drawn: the key ones, then each alert's."""
    return list(dict.fromkeys([*KEY_METRICS, *(a.metric for a in alerts if a.metric)]))


def _curves(lines: Sequence[Mapping[str, Any]], alerts: Sequence[AlertEntry]) -> list[Curve]:
    wanted = curve_metrics(alerts)
    latest: dict[str, int] = {}
    for line in lines:
        latest[line["role"]] = max(latest.get(line["role"], 0), int(line.get("attempt", 0)))
    width = thinning_width(len(lines))
    series: dict[tuple[str, str], _Thinned] = {}
    for line in lines:
        if int(line.get("attempt", 0)) != latest[line["role"]]:
            continue
        metrics = line["metrics"]
        for name in wanted:
            value = metrics.get(name)
            if value is not None:
                thinned = series.get((line["role"], name))
                if thinned is None:
                    thinned = series[(line["role"], name)] = _Thinned(width)
                thinned.add(int(line["step"]), value)
    return curves_from({key: thinned.close() for key, thinned in series.items()}, alerts)


def curves_from(series: Mapping[tuple[str, str], Sequence[tuple[int, float]]],
                alerts: Sequence[AlertEntry]) -> list[Curve]:
    """The curves of ``series`` ((role, metric) -> points), in :func:`curve_metrics` order,
    each with its role's alert markers."""
    out = []
    for name in curve_metrics(alerts):
        for (role, metric), points in sorted(series.items()):
            if metric != name or len(points) < 1:
                continue
            markers = [(a.fired_step, a.alert, "firing") for a in alerts if a.role == role]
            markers += [(a.resolved_step, a.alert, "resolved") for a in alerts
                        if a.role == role and a.resolved_step is not None
                        and not a.ended_with_run  # the run ended, not the condition
                        and not a.handed_to]  # its level rule took it over
            out.append(Curve(role, metric, tuple(points), tuple(sorted(markers))))
    return out


def _run_states(store: HistoryStore, run: str,
                roles: Sequence[RoleSummary] = ()) -> tuple[dict[str, Any], ...]:
    """Each role's state at the end: the last state the service stored (it stores a state when
    it changes), its last step the role's last stored step. A running state older than the
    role's last step says so: the service saw no end (it stopped, or the run goes on)."""
    try:
        rows = store.liveness(run)
    except sqlite3.OperationalError:  # a store written before liveness was kept
        return ()
    last = {r.role: r.last for r in roles}
    out = []
    for r in rows:
        step, detail = r["last_step"], r["detail"] or ""
        latest = last.get(r["role"])
        if latest is not None and (step is None or latest > step):
            if r["state"] in ("running", "slow"):
                detail = (f"no end recorded: the service last judged it {r['state']} at step "
                          f"{step if step is not None else '(none)'}" + (f"; {detail}" if detail
                                                                        else ""))
            step = latest
        out.append({"role": r["role"], "state": r["state"], "since": r["since"],
                    "last_step": step, "detail": detail})
    return tuple(out)


def build_report(store: HistoryStore, run: str, config: GoodputConfig | None = None,
                 now: float | None = None) -> RunReport:
    """The report of ``run`` from ``store`` (``config``: GPUs per rank, the span map, price,
    MFU inputs; the defaults otherwise)."""
    config = config or GoodputConfig()
    lines = store.steps(run)
    roles = _roles(lines)
    steps, stored = _goodput(store, run, lines, config)
    ends = [t.timeline.end_ns * 1e-9 for st in stored for t in st.ranks]
    alerts = _alerts(store, run, max(ends) if ends else None,
                     Price(config.price_per_gpu_hour, config.currency))
    totals = GoodputTotals()
    for s in steps:
        totals.add(s)
    reasons = tuple(sorted(((b.value, why, v) for (b, why), v in totals.by_reason().items()),
                           key=lambda r: (list(Bucket).index(Bucket(r[0])), -r[2])))
    slow_ranks, slow_stages = _slowest(stored, span_map(config))
    tokens = sum(float(line["metrics"].get(catalog.TOKENS) or 0.0) for line in lines)
    utilisation = None
    if config.model_flops_per_token is not None and config.peak_flops_per_gpu is not None:
        utilisation = mfu(tokens, config.model_flops_per_token, totals.total(),
                          config.peak_flops_per_gpu)
    notes = []
    unmapped = tuple(sorted({n for s in steps for n in s.unmapped}))
    if unmapped:
        notes.append(f"spans not in the map, counted as {config.unmapped_bucket}: "
                     + ", ".join(unmapped) + " (goodput.spans in the config classifies them)")
    if not config.gpus_per_rank:
        notes.append("GPUs per rank: 1 for every role (set goodput.gpus_per_rank in the config "
                     "for tensor-parallel engines or CPU-only workers)")
    if not stored:
        notes.append("the store keeps no timelines of this run: no goodput")
    return RunReport(
        run, time.time() if now is None else now, roles, alerts,
        {b.value: v for b, v in totals.by_bucket().items()}, reasons, totals.goodput,
        totals.total() / 3_600.0, totals.steps,
        tuple((s.attempt, s.step, {b.value: v for b, v in s.by_bucket().items()})
              for s in steps),
        unmapped, tuple(slow_ranks), tuple(slow_stages), tuple(_curves(lines, alerts)),
        utilisation, config.price_per_gpu_hour, config.currency, tuple(notes),
        _run_states(store, run, roles))
