"""``baseline``: a sustained departure from the run's own trailing baseline (the early-warning
rules; the detector is :mod:`rlmon.service.alerting.baseline`).

Its scalar half is the detector's ``observe`` step by step (the CUSUM score kept in the state);
its vector half is the same CUSUM run over a long log's column in one tight loop, from the
predictions :mod:`rlmon.service.alerting.baseline_batch` computes for the whole series in the
same floating-point operations, stopping where the score reaches the decision (the engine judges
that step). :func:`prepare` hands those predictions to a batch evaluated in order.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence

import numpy as np

from rlmon.service.alerting import baseline, baseline_batch
from rlmon.service.alerting.alert_types import AlertState
from rlmon.service.alerting.conditions.kind import (
    NOT_APPLICABLE,
    Advance,
    Check,
    Columns,
    Condition,
    ConditionKind,
    Export,
    RlmonOnly,
    RuleLike,
    watched,
)
from rlmon.service.contract.step_record import StepRecord

__all__ = ["BASELINE_FIELDS", "BASELINE_MAX_WINDOW", "Drift", "prepare"]

BASELINE_FIELDS = ("warmup", "allowance", "decision", "floor", "relative_floor", "log_offset",
                   "follow_drift", "spike_steps")
BASELINE_MAX_WINDOW = 1_000  # the detector sorts its window every step
# baseline values scored at a time (most stretches end at the series' end); small enough that
# a chunk's temporaries (window x chunk floats) are reused by the allocator: at 8,192 each was
# fresh memory, page-faulted in, a quarter of the time of a long log
_CHUNK = 1_024


def _cusum(rule: RuleLike, ahead: baseline_batch.SeriesPredictions, values: np.ndarray,
           applies: np.ndarray) -> Advance:
    """The CUSUM of an idle baseline rule over its series (the steps with a finite value),
    stopping at the first step whose score reaches the decision (the engine judges that one)."""
    params = ahead.params
    # the series' place -> the step's index, and back (32-bit: a log has fewer steps)
    where = np.flatnonzero(applies).astype(np.int32)
    position = np.concatenate(([0], np.cumsum(applies, dtype=np.int32)))
    series = values[where]
    cap = baseline.z_cap(params)
    ceiling = baseline._SCORE_CAP * params.decision
    allowance, decision = params.allowance, params.decision

    def advance(state: AlertState, start: int) -> int:
        place = int(position[start])
        if ahead.taken != place or state.ahead is not ahead:
            return start  # off the prepared series: the engine predicts itself
        score = state.score
        history = state.history
        chunk = 64  # grown while the stretch stays quiet: a short one predicts few windows
        while place < len(series):
            if len(history) < params.warmup or place < params.window:
                # the window still filling: as the engine does it (a few steps)
                trial = deque(history)
                new = baseline.observe(params, trial, score, float(series[place]))
                if new >= decision:
                    break
                score = new
                history.append(float(series[place]))
                while len(history) > params.window:
                    history.popleft()
                place += 1
                continue
            stop = min(place + chunk, len(series))
            chunk = min(2 * chunk, _CHUNK)
            expected, scale, usable = ahead.extrapolated(place, stop)
            z = (ahead.transformed(place, stop) - expected) / scale
            if params.direction == "down":
                z = -z
            z = np.minimum(np.maximum(z, -cap), cap)
            # the scores up to the first unusable window (the rest is not looked at)
            bad = np.flatnonzero(~usable)
            z_list = (z[:bad[0]] if bad.size else z).tolist()
            ends = place
            for zk in z_list:
                # min(max(0.0, x), ceiling) as Python picks them, without the calls
                new = score + zk - allowance
                if not new > 0.0:
                    new = 0.0
                elif ceiling < new:
                    new = ceiling
                if new >= decision:
                    break
                score = new
                ends += 1
            if ends > place:
                history.extend(series[max(place, ends - params.window):ends].tolist())
                while len(history) > params.window:
                    history.popleft()
            place = ends
            if ends < stop:
                break  # the score reached the decision, or a window with a non-finite value
        counted = place - int(position[start])
        if counted:
            ahead.skip(counted)
            state.score = score
            state.false_steps += counted
            state.true_steps = 0
        return int(where[place]) if place < len(series) else len(values)
    return advance


class Drift(ConditionKind):
    condition = Condition.BASELINE
    fields = ("window", "direction", *BASELINE_FIELDS)
    needs_metric = True

    def check(self, rule: RuleLike, record: StepRecord, state: AlertState) -> Check:
        value = watched(rule, record)
        if value is None:
            return NOT_APPLICABLE
        # the rule's parameters (a batch's predictions were made with them: built once)
        params = rule.baseline if state.ahead is None else state.ahead.params
        state.score = baseline.observe(params, state.history, state.score, value, state.ahead)
        holds = state.score >= params.decision
        if not holds and state.firing and state.reference is not None:
            holds = baseline.departed(params, state.reference, value)  # not yet back
        return Check(True, holds, rule.metric, value)

    def quiet(self, rule: RuleLike, state: AlertState, columns: Columns) -> Advance | None:
        values, applies = columns.finite(rule.metric)
        if np.count_nonzero(applies) < baseline_batch.MIN_SERIES:
            return None  # a short series: the engine predicts step by step as fast
        state.ahead = baseline_batch.SeriesPredictions(rule.baseline, values[applies].tolist())
        return _cusum(rule, state.ahead, values, applies)

    def promql(self, rule: RuleLike) -> Export:
        return RlmonOnly.RUN_STATE

    def describe(self, rule: RuleLike) -> str:
        p = rule.baseline
        side = "rising above" if p.direction == "up" else "falling below"
        kind = "baseline" if p.follow_drift else "baseline level"
        usual = baseline.BaselineParams(p.direction).spike_steps  # said only where it differs
        spikes = "" if p.spike_steps == usual else f", {p.spike_steps} steps however far out"
        return (f"{rule.metric} {side} its own {p.window}-step {kind} "
                f"(CUSUM {p.allowance:g}/{p.decision:g} robust SDs{spikes}, after {p.warmup} "
                "steps)")

    def validate(self, rule: RuleLike) -> None:
        if rule.direction is None:
            raise ValueError("condition 'baseline' needs 'direction' (up or down)")
        for name in ("allowance", "decision", "floor", "relative_floor", "log_offset"):
            value = getattr(rule, name)
            if value is not None and not math.isfinite(value):
                raise ValueError(f"'{name}' must be a finite number, got {value}")
        params = rule.baseline
        if not params.warmup <= params.window <= BASELINE_MAX_WINDOW:
            raise ValueError(f"'window' ({params.window}) must be at least 'warmup' "
                             f"({params.warmup}) and at most {BASELINE_MAX_WINDOW}")
        if params.log_offset is not None and getattr(rule, "floor", None) is not None:
            raise ValueError("'floor' is in the metric's units and does not apply with "
                             "'log_offset' (use 'relative_floor')")


def prepare(rules: Sequence[RuleLike], ordered: Sequence[StepRecord],
            fresh: Callable[[tuple[str, str, str]], bool],
            ) -> dict[tuple[str, str, str], baseline_batch.SeriesPredictions]:
    """For each (run, role, baseline rule) with no state yet, the series of values its detector
    will observe when ``ordered`` (sorted by identity) is evaluated: the steps the engine
    evaluates up to the stream's first restart (a later attempt starts from a fresh state),
    those holding the metric with a finite value. Only series of ``MIN_SERIES`` values or more.
    ``roles``: whether a rule applies to a role."""
    wanted = [r for r in rules if r.condition is Condition.BASELINE]
    if not wanted or len(ordered) < baseline_batch.MIN_SERIES:
        return {}
    values: dict[tuple[str, str, str], list[float]] = {}
    first_attempt: dict[tuple[str, str], int] = {}
    last_step: dict[tuple[str, str], int] = {}
    streams: dict[tuple[str, str], list[tuple[str, str, str, str]]] = {}
    for record in ordered:
        stream = (record.run, record.role)
        attempt = first_attempt.setdefault(stream, record.attempt)
        if record.attempt != attempt or record.step <= last_step.get(stream, -1):
            continue  # after a restart (states reset) or a step the engine skips
        last_step[stream] = record.step
        keyed = streams.get(stream)
        if keyed is None:
            keyed = streams[stream] = [
                (record.run, record.role, rule.name, rule.metric) for rule in wanted
                if (rule.roles is None or record.role in rule.roles)
                and fresh((record.run, record.role, rule.name))]
        metrics = record.metrics
        for run, role, name, metric in keyed:
            value = metrics.get(metric)
            if value is not None and math.isfinite(value):
                values.setdefault((run, role, name), []).append(value)
    by_name = {rule.name: rule for rule in wanted}
    return {key: baseline_batch.SeriesPredictions(by_name[key[2]].baseline, series)
            for key, series in values.items() if len(series) >= baseline_batch.MIN_SERIES}
