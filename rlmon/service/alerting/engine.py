"""The alert engine: one state machine per (run, role, alert), driven by finalized steps.

States: inactive -> pending (condition true, fewer than ``for`` steps) -> firing -> resolved
(condition false for ``resolve_after`` steps). Only transitions to firing and to resolved produce
events. Steps of one (run, role) must be evaluated in increasing order; an older step that arrives
after a newer one was evaluated is skipped and counted, never evaluated out of order.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from types import MappingProxyType
from typing import NamedTuple

from rlmon.service.alerting import baseline, baseline_batch, reward_hacking
from rlmon.service.alerting.alert_types import AlertEvent, AlertState, State
from rlmon.service.alerting.projection import alert_detail as heading
from rlmon.service.alerting.rules import ANY_METRIC, LIVENESS_CONDITIONS, Condition, Rule
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.metrics import catalog

__all__ = ["AlertEngine", "AlertEvent", "AlertState", "evaluate_in_order", "evaluate_sorted"]

class _Check(NamedTuple):  # one per rule per step: a tuple is built at a fraction of the cost
    applies: bool
    holds: bool = False
    metric: str = ""
    value: float | None = None
    detail: str = ""


_NOT_APPLICABLE = _Check(False)
_RANK_KEY_MASK = 2**53 - 1  # a rank's key kept in AlertState.history: exact in a float


def _straggler_check(rule: Rule, record: StepRecord, state: AlertState) -> _Check:
    """The step's slowest rank over the threshold, and the same rank as the steps before
    (another rank starts the count over); the rank is remembered in ``state.history``."""
    found = record.straggler
    if found is None:
        return _NOT_APPLICABLE  # fewer than two ranks sent a timeline
    assert rule.threshold is not None
    holds = found.ratio > rule.threshold
    key = float(hash(tuple(found.rank)) & _RANK_KEY_MASK)  # ints hash alike in every process
    if holds and state.history and state.history[-1] != key:
        state.true_steps = 0
    state.history.clear()
    if holds:
        state.history.append(key)
    return _Check(True, holds, catalog.STRAGGLER_METRIC, found.ratio,
                  found.describe() if holds else "")


def _compare(op: str, value: float, threshold: float) -> bool:
    if op == ">":
        return value > threshold
    if op == ">=":
        return value >= threshold
    if op == "<":
        return value < threshold
    if op == "<=":
        return value <= threshold
    return abs(value) < threshold  # "abs<"


def _window_check(rule: Rule, state: AlertState, value: float) -> bool:
    window = rule.window or 2
    state.history.append(value)
    while len(state.history) > window:
        state.history.popleft()
    if len(state.history) < window:
        return False
    values = list(state.history)
    if rule.condition is Condition.STUCK:
        return max(values) - min(values) <= rule.tolerance
    pairs = list(itertools.pairwise(values))
    if rule.direction == "up":
        return all(b > a for a, b in pairs)
    return all(b < a for a, b in pairs)


def _check(rule: Rule, record: StepRecord, state: AlertState) -> _Check:
    cond = rule.condition
    metrics = record.metrics
    if cond in LIVENESS_CONDITIONS:
        return _NOT_APPLICABLE  # judged by time, on the liveness timer (ServiceCore.liveness)
    if cond is Condition.RANK_MISSING:
        return _Check(True, not record.complete, "ranks_reporting", float(record.ranks_reporting))
    if cond is Condition.STRAGGLER_RANK:
        return _straggler_check(rule, record, state)
    if cond is Condition.REPLICA_MISMATCH:
        names = [n for n in record.replica_mismatches if rule.metric in (ANY_METRIC, n)]
        first = names[0] if names else rule.metric
        return _Check(True, bool(names), first if first != ANY_METRIC else "", metrics.get(first))
    if cond is Condition.NON_FINITE:
        if rule.metric != ANY_METRIC and rule.metric not in metrics:
            return _NOT_APPLICABLE
        names = sorted(metrics) if rule.metric == ANY_METRIC else [rule.metric]
        bad = [n for n in names if not math.isfinite(metrics[n])]
        return _Check(True, bool(bad), bad[0] if bad else "", metrics[bad[0]] if bad else None)
    if cond is Condition.OUT_OF_DOMAIN:
        names = sorted(metrics) if rule.metric == ANY_METRIC else [rule.metric]
        for name in names:
            spec = catalog.lookup(name)
            value = metrics.get(name)
            if spec is None or value is None or not math.isfinite(value):
                continue
            if not spec.domain.contains(value):
                return _Check(True, True, name, value)
        return _Check(True, False)
    value = metrics.get(rule.metric)
    if value is None or not math.isfinite(value):
        return _NOT_APPLICABLE  # absent is not zero; NaN is NonFiniteMetric's job
    if cond is Condition.THRESHOLD:
        assert rule.op is not None
        assert rule.threshold is not None
        return _Check(True, _compare(rule.op, value, rule.threshold), rule.metric, value)
    if cond is Condition.OUTSIDE:
        assert rule.low is not None
        assert rule.high is not None
        return _Check(True, value < rule.low or value > rule.high, rule.metric, value)
    if cond is Condition.BASELINE:
        # the rule's parameters (a batch's predictions were made with them: built once)
        params = rule.baseline if state.ahead is None else state.ahead.params
        state.score = baseline.observe(params, state.history, state.score, value, state.ahead)
        return _Check(True, state.score >= params.decision, rule.metric, value)
    if cond is Condition.REWARD_HACKING:  # its own module: rlmon.service.alerting.reward_hacking
        hacking = rule.reward_hacking
        state.score, found = reward_hacking.observe(hacking, state.history, state.score, metrics)
        return _Check(True, state.score >= hacking.decision, rule.metric, value,
                      found.describe() if found is not None else "")
    return _Check(True, _window_check(rule, state, value), rule.metric, value)


class AlertEngine:
    """Evaluates rules on finalized steps and emits firing / resolved events."""

    def __init__(self, rules: Sequence[Rule]) -> None:
        self.rules = list(rules)
        self.states: dict[tuple[str, str, str], AlertState] = {}
        self.last_step: dict[tuple[str, str], int] = {}
        self.attempts: dict[tuple[str, str], int] = {}  # latest attempt seen per (run, role)
        self.skipped_out_of_order = 0

    def firing(self) -> list[tuple[str, str, str]]:
        """(run, role, alert) of every alert firing now."""
        return [key for key, st in self.states.items() if st.firing]

    def severity_of(self, alert: str) -> str:
        for rule in self.rules:
            if rule.name == alert:
                return rule.severity.value
        return "warning"

    def forget(self, run: str) -> None:
        """Drop the state of a finished run."""
        self.forget_streams({k[:2] for k in self.states if k[0] == run}
                            | {k for k in self.last_step if k[0] == run})

    # --- the state it owns: restored, read and forgotten only through these ----------------------

    def restore(self, states: Mapping[tuple[str, str, str], AlertState],
                last_steps: Mapping[tuple[str, str], int] | None = None,
                attempts: Mapping[tuple[str, str], int] | None = None) -> None:
        """Continue from saved state (a restarted service, a stream back in memory): each
        (run, role, alert) where it stopped, each stream's last evaluated step and attempt."""
        self.states.update(states)
        self.last_step.update(last_steps or {})
        self.attempts.update(attempts or {})

    def forget_streams(self, streams: Iterable[tuple[str, str]]) -> None:
        """Drop what the engine keeps of these (run, role) streams (saved in the history
        store, restored when a stream comes back)."""
        for run, role in streams:
            for rule in self.rules:
                self.states.pop((run, role, rule.name), None)
            self.last_step.pop((run, role), None)
            self.attempts.pop((run, role), None)

    def streams(self) -> set[tuple[str, str]]:
        """Every (run, role) the engine holds state of."""
        return set(self.last_step) | {k[:2] for k in self.states}

    def state(self, run: str, role: str, alert: str) -> AlertState | None:
        return self.states.get((run, role, alert))

    def is_firing(self, run: str, role: str, alert: str) -> bool:
        state = self.states.get((run, role, alert))
        return state is not None and state.firing

    def attempt_of(self, run: str, role: str) -> int:
        """The latest attempt (restart count) seen of (run, role)."""
        return self.attempts.get((run, role), 0)

    def stream_states(self, run: str, role: str) -> dict[tuple[str, str, str], AlertState]:
        """(run, role, alert) -> state of one stream, in the rules' order."""
        states = self.states
        return {key: states[key] for rule in self.rules
                if (key := (run, role, rule.name)) in states}

    def states_of(self, streams: Iterable[tuple[str, str]],
                  ) -> dict[tuple[str, str, str], AlertState]:
        """The states of several streams (what a batch stores with its steps)."""
        out: dict[tuple[str, str, str], AlertState] = {}
        for run, role in streams:
            out.update(self.stream_states(run, role))
        return out

    def last_steps_of(self, streams: Iterable[tuple[str, str]]) -> dict[tuple[str, str], int]:
        return {s: self.last_step[s] for s in streams if s in self.last_step}

    def all_states(self) -> Mapping[tuple[str, str, str], AlertState]:
        """Every state (read only: for the cost accounting's restore)."""
        return MappingProxyType(self.states)

    def judge(self, run: str, role: str, rule: Rule, holds: bool, step: int) -> bool:
        """A condition judged outside the steps (the liveness timer's): set (run, role,
        rule)'s state; True when it changed (fired or resolved)."""
        key = (run, role, rule.name)
        state = self.states.get(key)
        if state is None:
            state = self.states[key] = AlertState()
        if holds == state.firing:
            return False
        state.firing = holds
        state.true_steps, state.false_steps = (1, 0) if holds else (0, 1)
        if holds:
            state.since_step = step
        return True

    def evaluate(self, record: StepRecord) -> list[AlertEvent]:
        """Feed one finalized step; returns the alerts that fired or resolved at it."""
        stream = (record.run, record.role)
        events: list[AlertEvent] = []
        if record.attempt > self.attempts.get(stream, 0):
            events.extend(self._restart(record))
        elif record.attempt < self.attempts.get(stream, 0):
            self.skipped_out_of_order += 1
            return []
        last = self.last_step.get(stream)
        if last is not None and record.step <= last:
            self.skipped_out_of_order += 1
            return []
        self.last_step[stream] = record.step
        for rule in self.rules:
            if rule.roles is not None and record.role not in rule.roles:
                continue
            key = (record.run, record.role, rule.name)
            state = self.states.get(key)
            if state is None:
                state = self.states[key] = AlertState()
            check = _check(rule, record, state)
            if not check.applies:
                continue
            event = self._step(rule, record, state, check)
            if event is not None:
                events.append(event)
        return events

    def _step(
        self, rule: Rule, record: StepRecord, state: AlertState, check: _Check
    ) -> AlertEvent | None:
        if check.holds:
            state.true_steps += 1
            state.false_steps = 0
            if not state.firing and state.true_steps >= rule.for_steps:
                state.firing = True
                state.since_step = record.step
                state.metric = check.metric
                event = self._event(rule, record, "firing", check)
                if rule.condition is Condition.BASELINE and state.history:
                    # where the metric is heading (rlmon.service.alerting.projection)
                    ahead = heading(rule.metric, state.history, self.rules)
                    if ahead:
                        event = replace(event, detail="; ".join(filter(None, (event.detail,
                                                                            ahead))))
                return event
        else:
            state.false_steps += 1
            state.true_steps = 0
            if state.firing and state.false_steps >= rule.resolve_steps:
                state.firing = False
                if not check.metric and state.metric:
                    check = _Check(True, False, state.metric, record.metrics.get(state.metric))
                return self._event(rule, record, "resolved", check)
        return None

    def _restart(self, record: StepRecord) -> list[AlertEvent]:
        """A rerun under the same name starts afresh: the last attempt's firing alerts resolve
        (no incident stays open for a run that no longer exists) and every rule starts over, so
        the same fault in the new attempt fires again."""
        stream = (record.run, record.role)
        self.attempts[stream] = record.attempt
        self.last_step.pop(stream, None)
        resolved = []
        for rule in self.rules:
            key = (record.run, record.role, rule.name)
            state = self.states.get(key)
            if state is None:
                continue
            self.states[key] = AlertState()  # saved with the step, so a restart keeps it reset
            if state.firing:
                event = self._event(rule, record, "resolved", _Check(True, False, state.metric))
                resolved.append(replace(event, value=None,
                                        summary=f"{event.summary} (the run restarted)"))
        return resolved

    @staticmethod
    def _event(rule: Rule, record: StepRecord, state: State, check: _Check) -> AlertEvent:
        metric = check.metric or (rule.metric if rule.metric != ANY_METRIC else "")
        spec = catalog.lookup(metric)
        return AlertEvent(
            run=record.run,
            role=record.role,
            step=record.step,
            alert=rule.name,
            severity=rule.severity.value,
            state=state,
            metric=metric,
            value=check.value if check.metric else record.metrics.get(metric),
            summary=rule.summary or rule.describe(),
            condition=rule.describe(),
            what_to_check=reward_hacking.WHAT_TO_CHECK
            if rule.condition is Condition.REWARD_HACKING
            else spec.what_to_check if spec is not None else "",
            attempt=record.attempt,
            detail=check.detail,
        )


def evaluate_in_order(engine: AlertEngine, records: Iterable[StepRecord]) -> list[
    tuple[StepRecord, list[AlertEvent]]
]:
    """Evaluate a batch of records per (run, role) in increasing step order."""
    return list(evaluate_sorted(engine, sorted(records, key=lambda r: r.identity)))


def evaluate_sorted(engine: AlertEngine, ordered: Sequence[StepRecord],
                    ) -> Iterator[tuple[StepRecord, list[AlertEvent]]]:
    """Evaluate records already sorted by identity, one at a time (a long log's records can be
    built as they are reached); a long batch's baseline predictions are computed at once (the
    same numbers: rlmon.service.alerting.baseline_batch)."""
    for key, series in baseline_batch.prepare(engine.rules, ordered,
                                              lambda k: k not in engine.states).items():
        engine.states[key] = AlertState(ahead=series)
    for record in ordered:
        yield record, engine.evaluate(record)
