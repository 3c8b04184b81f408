"""A long recorded series evaluated by the engine only where something can happen.

``rlmon diagnose`` of a million-step log asks each rule about each step, and at nearly every
step nothing happens: a threshold is not crossed, a detector's score stays low. A rule that is
*idle* (not firing, no step towards firing counted) changes at such a step only by counting it as
good (``false_steps``), and no other rule reads that count (a rule reads another's ``firing``
only, which an idle rule never changes). So, per rule, the steps where its check cannot hold are
found at once from the series' columns (numpy masks; a baseline rule's CUSUM score run over
its whole series in one tight loop, from the same predictions as
:mod:`rlmon.service.alerting.baseline_batch`, in the same floating-point operations) and counted
in bulk; the engine itself (:meth:`AlertEngine.evaluate_rules`) judges the rest, in step order
and rule order, with the state it would have had. A rule that is pending or firing is judged at
every step; a rule whose kind has no quiet test here is judged at every step. The events, steps
and final states are the live engine's (``tests/service/alerting/test_batch_equals_live.py``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Protocol

import numpy as np

from rlmon.service.alerting import baseline, baseline_batch
from rlmon.service.alerting.alert_types import AlertEvent, AlertState
from rlmon.service.alerting.engine import AlertEngine
from rlmon.service.alerting.rules import ANY_METRIC, LIVENESS_CONDITIONS, Condition, Rule
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.metrics import catalog
from rlmon.service.metrics.spec import Domain

__all__ = ["ColumnSeries", "evaluate_quietly"]

# baseline values scored at a time (most stretches end at the series' end); small enough that
# a chunk's temporaries (window x chunk floats) are reused by the allocator: at 8,192 each was
# fresh memory, page-faulted in, a quarter of the time of a long log
_CHUNK = 1_024


class ColumnSeries(Protocol):
    """One (run, role)'s steps in increasing order (attempt 0), by column and as records."""

    @property
    def run(self) -> str: ...

    @property
    def role(self) -> str: ...

    @property
    def names(self) -> list[str]:
        """The metrics logged at some step, sorted."""
        ...

    def __len__(self) -> int: ...

    def record(self, index: int) -> StepRecord: ...

    def column(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(values, present) of a metric, one per step."""
        ...


# next index >= start the engine must judge, once the steps before it are counted in the state
_Advance = Callable[[AlertState, int], int]


def _first(mask: np.ndarray, start: int) -> int:
    found = np.flatnonzero(mask[start:])
    return start + int(found[0]) if found.size else len(mask)


def _counted(applies: np.ndarray, holds: np.ndarray) -> _Advance:
    """A rule whose check holds only where ``holds``: the applicable steps before the next
    such step are good steps."""
    def advance(state: AlertState, start: int) -> int:
        stop = _first(holds, start)
        count = int(np.count_nonzero(applies[start:stop]))  # ranges never overlap: O(steps)
        if count:
            state.false_steps += count
            state.true_steps = 0
        return stop
    return advance


def _outside_domain(values: np.ndarray, present: np.ndarray, domain: Domain) -> np.ndarray:
    finite = present & np.isfinite(values)
    if domain is Domain.NONNEGATIVE:
        return finite & ~(values >= 0.0)
    if domain is Domain.FRACTION:
        return finite & ~((values >= 0.0) & (values <= 1.0))
    return np.zeros(len(values), dtype=bool)


def _baseline(rule: Rule, ahead: baseline_batch.SeriesPredictions, values: np.ndarray,
              present: np.ndarray) -> _Advance:
    """The CUSUM of an idle baseline rule over its series (the steps with a finite value),
    stopping at the first step whose score reaches the decision (the engine judges that one)."""
    params = ahead.params
    applies = present & np.isfinite(values)
    # the series' place -> the step's index, and back (32-bit: a log has fewer steps)
    where = np.flatnonzero(applies).astype(np.int32)
    position = np.concatenate(([0], np.cumsum(applies, dtype=np.int32)))
    series = values[where]
    cap = params.allowance + params.decision / 2
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


def _advance_of(rule: Rule, state: AlertState, series: ColumnSeries,
                column: Callable[[str], tuple[np.ndarray, np.ndarray]],
                every: np.ndarray, never: np.ndarray) -> _Advance | None:
    """How to skip the quiet steps of an idle ``rule``; None: judge it at every step."""
    cond = rule.condition
    if cond in LIVENESS_CONDITIONS or cond is Condition.STRAGGLER_RANK:
        return lambda state, start: len(every)  # never judged on a log's records
    if cond in (Condition.RANK_MISSING, Condition.REPLICA_MISMATCH):
        return _counted(every, never)  # a log's records are complete, one replica
    if cond is Condition.NON_FINITE:
        if rule.metric == ANY_METRIC:
            bad = never.copy()
            for name in series.names:
                values, present = column(name)
                bad |= present & ~np.isfinite(values)
            return _counted(every, bad)
        values, present = column(rule.metric)
        return _counted(present, present & ~np.isfinite(values))
    if cond is Condition.OUT_OF_DOMAIN:
        bad = never.copy()
        for name in (series.names if rule.metric == ANY_METRIC else [rule.metric]):
            spec = catalog.lookup(name)
            if spec is not None:
                values, present = column(name)
                bad |= _outside_domain(values, present, spec.domain)
        return _counted(every, bad)
    if cond is Condition.REWARD_HACKING:
        # judged where the reward is (the engine's check needs its metric); the detector
        # scores only a step with a reward and a length, and an idle rule's score is below
        # the decision, so a step with no length changes nothing
        reward, has_reward = column(rule.metric)
        length, has_length = column(catalog.RESPONSE_LENGTH)
        applies = has_reward & np.isfinite(reward)
        with np.errstate(invalid="ignore"):
            judged = applies & has_length & np.isfinite(length) & (length > 0)
        return _counted(applies, judged)
    if cond in (Condition.THRESHOLD, Condition.OUTSIDE):
        values, present = column(rule.metric)
        applies = present & np.isfinite(values)
        with np.errstate(invalid="ignore"):
            if cond is Condition.OUTSIDE:
                assert rule.low is not None and rule.high is not None
                holds = (values < rule.low) | (values > rule.high)
            else:
                assert rule.op is not None and rule.threshold is not None
                compare = {">": np.greater, ">=": np.greater_equal, "<": np.less,
                           "<=": np.less_equal}.get(rule.op)
                holds = compare(values, rule.threshold) if compare is not None \
                    else np.abs(values) < rule.threshold  # "abs<"
        return _counted(applies, applies & holds)
    if cond is Condition.BASELINE and state.ahead is not None:
        values, present = column(rule.metric)
        return _baseline(rule, state.ahead, values, present)
    return None


def evaluate_quietly(engine: AlertEngine, series: ColumnSeries,
                     ) -> Iterator[tuple[int, list[AlertEvent]]]:
    """(index, events) of each step of ``series`` where a rule fired or resolved, as
    :func:`~rlmon.service.alerting.engine.evaluate_sorted` would raise them; ``engine`` holds
    no state of the series' stream yet."""
    size = len(series)
    if not size:
        return
    run, role = series.run, series.role
    rules = [r for r in engine.rules if r.roles is None or role in r.roles]
    states = {}
    for rule in rules:
        states[rule.name] = engine.states[(run, role, rule.name)] = AlertState()
    columns: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def column(name: str) -> tuple[np.ndarray, np.ndarray]:
        if name not in columns:
            columns[name] = series.column(name)
        return columns[name]

    for rule in rules:
        if rule.condition is Condition.BASELINE:
            values, present = column(rule.metric)
            finite = values[present & np.isfinite(values)]
            if len(finite) >= baseline_batch.MIN_SERIES:
                states[rule.name].ahead = baseline_batch.SeriesPredictions(
                    rule.baseline, finite.tolist())
    every = np.ones(size, dtype=bool)
    never = np.zeros(size, dtype=bool)
    skippers = [_advance_of(rule, states[rule.name], series, column, every, never)
                for rule in rules]

    def idle(state: AlertState) -> bool:
        return not state.firing and state.true_steps == 0

    due = [0] * len(rules)
    for k, rule in enumerate(rules):
        skip = skippers[k]
        due[k] = skip(states[rule.name], 0) if skip is not None else 0
    while True:
        index = min(due)
        if index >= size:
            break
        record = series.record(index)
        now = [rule for k, rule in enumerate(rules) if due[k] == index]
        events = engine.evaluate_rules(record, now)
        for k, rule in enumerate(rules):
            if due[k] != index:
                continue
            skip = skippers[k]
            state = states[rule.name]
            due[k] = skip(state, index + 1) if skip is not None and idle(state) \
                else index + 1
        if events:
            yield index, events
    engine.last_step[(run, role)] = series.record(size - 1).step

