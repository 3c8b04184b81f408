"""The alert engine: one state machine per (run, role, alert), driven by finalized steps.

States: inactive -> pending (condition true, fewer than ``for`` steps) -> firing -> resolved
(condition false for ``resolve_after`` steps). Only transitions to firing and to resolved produce
events. Steps of one (run, role) must be evaluated in increasing order; an older step that arrives
after a newer one was evaluated is skipped and counted, never evaluated out of order.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType

from rlmon.service.alerting import baseline, heading, level_shift
from rlmon.service.alerting.alert_types import AlertEvent, AlertState, State
from rlmon.service.alerting.conditions import drift
from rlmon.service.alerting.conditions.kind import Check as _Check
from rlmon.service.alerting.conditions.registry import CONDITIONS
from rlmon.service.alerting.rules import ANY_METRIC, Condition, Rule
from rlmon.service.alerting.what_to_check import what_to_check
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.metrics.spec import Severity

__all__ = ["AlertEngine", "AlertEvent", "AlertState", "NotifyPolicy", "evaluate_in_order",
           "evaluate_sorted", "level_before"]


def _check(rule: Rule, record: StepRecord, state: AlertState) -> _Check:
    """The rule's condition at this step, as its kind defines it
    (:mod:`rlmon.service.alerting.conditions`)."""
    return CONDITIONS[rule.condition].check(rule, record, state)


def level_before(rule: Rule, state: AlertState) -> float | None:
    """A firing baseline rule's pre-onset level, in the metric's units (None: not one)."""
    if rule.condition is not Condition.BASELINE or state.reference is None:
        return None
    params = rule.baseline if state.ahead is None else state.ahead.params
    return baseline.level(params, state.reference)


def _dropped(rule: Rule, before: float | None, value: float | None) -> bool:
    """Whether ``value`` is more than the rule's ``critical_drop`` below ``before``."""
    if rule.critical_drop is None or before is None or before <= 0 or value is None \
            or not math.isfinite(value):
        return False
    return value <= (1 - rule.critical_drop) * before


def _pinned(rule: Rule, state: AlertState, value: float | None) -> bool:
    """Whether the value has not moved at all over the rule's last ``critical_pinned`` steps
    (the detector's window ends with this step's value): a mean of many samples that stays
    exactly put is every sample at a hard limit, the length cap."""
    need = rule.critical_pinned
    if need is None or value is None or len(state.history) < need:
        return False
    return all(v == value for v in itertools.islice(reversed(state.history), need))


def _critical_by_course(rule: Rule, state: AlertState, value: float | None) -> bool:
    """Whether a warning's value is at a critical level judged over many steps already: fallen
    by its ``critical_drop`` from the level before the onset, or pinned at its cap."""
    return _dropped(rule, level_before(rule, state), value) or _pinned(rule, state, value)


def _critical(rule: Rule, state: AlertState, value: float | None) -> bool:
    """Whether a warning's value is at its critical level: past the rule's ``critical`` bound,
    or at one of :func:`_critical_by_course`'s."""
    return rule.crosses_critical(value) or _critical_by_course(rule, state, value)


def _critical_at_firing(rule: Rule, state: AlertState, value: float | None, step: int) -> bool:
    """Whether a warning that is not firing yet is past its fixed ``critical`` bound on this step
    and the one before (the first kept in ``state.critical_since``: the step the alert quotes).
    A value that jumps from quiet past the bound for one step is a spike of a noisy mean, not a
    page: a small batch's token-mean logprob difference at 14x its median for one step was
    critical on a healthy run. A warning already firing escalates as soon as it crosses."""
    if not rule.crosses_critical(value):
        state.critical_since = None
        return False
    if state.critical_since is None:
        state.critical_since = step
    return step > state.critical_since


def _escalates(rule: Rule, state: AlertState, value: float | None) -> bool:
    """Whether a firing warning is at its critical level now (forgetting a spike's first step
    where it is not)."""
    if _critical(rule, state, value):
        return True
    state.critical_since = None
    return False


def _critical_words(rule: Rule, state: AlertState, value: float | None, step: int,
                    ) -> tuple[str, str]:
    """(why it is critical, the condition it quotes) for a value at its critical level: the
    level that made it critical and the step, never the warning's condition ("" where the value
    is at none of them)."""
    before = level_before(rule, state)
    if value is not None and before is not None and _dropped(rule, before, value):
        assert rule.critical_drop is not None
        return (f"{rule.metric} fell {1 - value / before:.0%} below its own pre-onset level "
                f"{before:.3g}, past the critical drop of {rule.critical_drop:.0%}, at step "
                f"{step}", rule.describe_critical(before))
    if value is not None and _pinned(rule, state, value):
        return (f"{rule.metric} pinned at {value:g} for {rule.critical_pinned} steps: every "
                f"sample at a hard limit (the length cap, {value:g})",
                f"{rule.metric} unchanged at {value:g} for {rule.critical_pinned} steps: pinned "
                "at its cap (the critical level)")
    if rule.crosses_critical(value):
        first = step if state.critical_since is None else state.critical_since
        return (f"{rule.metric} crossed the critical level {rule.critical:g} at step {first}",
                rule.describe_critical())
    return "", ""


@dataclass(frozen=True, slots=True)
class NotifyPolicy:
    """How often one alert may reach a person, on the steps' own clock (their finalization or
    record time; a step without one is not bounded): a still-firing critical alert is re-sent
    every ``repeat_seconds``; one (run, role, alert) sends at most ``per_hour`` notifications
    in any hour (the last says so; the rest are stored, not sent)."""

    repeat_seconds: float = 4 * 3600.0  # Alertmanager's default repeat_interval
    per_hour: int = 6


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:g} h" if seconds >= 3600 else f"{seconds / 60:g} min"


def _clock(at: float) -> str:
    return time.strftime("%H:%M UTC", time.gmtime(at))


class AlertEngine:
    """Evaluates rules on finalized steps and emits firing / resolved events."""

    def __init__(self, rules: Sequence[Rule], policy: NotifyPolicy | None = None) -> None:
        self.rules = list(rules)
        self._by_name = {rule.name: rule for rule in self.rules}
        self.policy = policy or NotifyPolicy()
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
        state.severity = rule.severity.value if holds else ""
        if holds:
            state.since_step = step
        return True

    def notified(self, event: AlertEvent, now: float | None) -> AlertEvent:
        """An event made outside the steps (the liveness timer's) under the per-hour bound."""
        state = self.states.get((event.run, event.role, event.alert))
        return event if state is None else self._notify(state, event, now)

    def repeat_due(self, run: str, role: str, alert: str, now: float) -> bool:
        """Whether a critical alert firing outside the steps is due its re-send at ``now``."""
        state = self.states.get((run, role, alert))
        return (state is not None and state.firing and state.severity == "critical"
                and bool(state.sent) and now - state.sent[-1] >= self.policy.repeat_seconds)

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
        events.extend(self.evaluate_rules(record, self.rules))
        return events

    def evaluate_rules(self, record: StepRecord, rules: Iterable[Rule]) -> list[AlertEvent]:
        """Judge ``record`` by these of the engine's rules only, in their order (the steps
        and order are the caller's: :mod:`rlmon.service.alerting.quiet_steps` skips the steps
        where a rule provably does nothing)."""
        events: list[AlertEvent] = []
        for rule in rules:
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
        now = record.finalized_at if record.finalized_at is not None else record.time
        level = self.states.get((record.run, record.role, rule.level_rule)) \
            if rule.level_rule else None
        handed = level is not None and level.firing  # its level rule speaks for it now
        if check.holds:
            state.true_steps += 1
            state.false_steps = 0
            # a warning not yet firing counts its steps past the critical bound
            critical = not state.firing and _critical_at_firing(rule, state, check.value,
                                                                record.step)
            if not state.firing and state.true_steps >= rule.for_steps and not handed \
                    and not self._held_back(rule, record, state):
                state.firing = True
                state.since_step = record.step
                state.metric = check.metric
                if rule.condition is Condition.BASELINE:  # the level before the onset
                    params = rule.baseline if state.ahead is None else state.ahead.params
                    state.reference = baseline.reference(params, state.history)
                critical = critical or _critical_by_course(rule, state, check.value)
                state.severity = (Severity.CRITICAL.value if critical
                                  else rule.severity.value)
                event = self._event(rule, record, "firing", check, state.severity)
                if state.severity != rule.severity.value:  # past the critical level at once
                    event = replace(event, condition=_critical_words(
                        rule, state, check.value, record.step)[1])
                if rule.condition is Condition.BASELINE and state.history:
                    # where the metric is heading (rlmon.service.alerting.projection)
                    ahead = heading.at_firing(rule, state, self.rules, record.step)
                    if ahead:
                        event = replace(event, detail="; ".join(filter(None, (event.detail,
                                                                            ahead))))
                return self._notify(state, event, now)
        else:
            state.false_steps += 1
            state.true_steps = 0
            state.critical_since = None
        if not state.firing:
            return None
        if (not check.holds and state.false_steps >= rule.resolve_steps) or handed:
            return self._resolve(rule, record, state, check, now, handed_to=(
                rule.level_rule if check.holds else ""))
        if check.holds and state.severity == Severity.WARNING.value and (
                _escalates(rule, state, check.value) or (
                    rule.escalate_after is not None and state.since_step is not None
                    and record.step - state.since_step >= rule.escalate_after)):
            return self._escalate(rule, record, state, check, now)
        if state.severity == Severity.CRITICAL.value and now is not None and state.sent \
                and now - state.sent[-1] >= self.policy.repeat_seconds:
            event = self._event(rule, record, "firing", check, state.severity)
            return self._notify(state, replace(event, repeat=True, summary=(
                f"{event.summary} (still firing since step {state.since_step}: re-sent every "
                f"{_hours(self.policy.repeat_seconds)})")), now)
        if check.holds and rule.condition is Condition.BASELINE:
            ahead, news = heading.refreshed(rule, state, self.rules, record.step)
            if ahead:  # where it is heading, stated now or stated anew
                event = self._event(rule, record, "firing", check, state.severity)
                event = replace(event, repeat=True, detail=ahead, summary=(
                    f"{event.summary} (firing since step {state.since_step}; where it is "
                    "heading now)"))
                return self._notify(state, event, now) if news else replace(event, notify=False)
        return None

    def _held_back(self, rule: Rule, record: StepRecord, state: AlertState) -> bool:
        """A baseline rule about to fire on a level shift short of its level rule's level,
        or on whole-step jitter, waits (rlmon.service.alerting.level_shift)."""
        if rule.condition is not Condition.BASELINE:
            return False
        params = rule.baseline if state.ahead is None else state.ahead.params
        if level_shift.jitter(params, state.history, state.true_steps):
            return True
        level = self._by_name.get(rule.level_rule)
        state.shift = None if level is None or rule.metric not in level_shift.SHIFTS_FOR_A_CAUSE \
            or _check(level, record, AlertState()).holds \
            else level_shift.hold(params, state.history, state.true_steps, record.step,
                                  state.shift)
        return state.shift is not None

    def _resolve(self, rule: Rule, record: StepRecord, state: AlertState, check: _Check,
                 now: float | None, handed_to: str) -> AlertEvent:
        state.firing = False
        if not check.metric and state.metric:
            check = _Check(True, False, state.metric, record.metrics.get(state.metric))
        event = self._event(rule, record, "resolved", check, state.severity or None)
        if handed_to:
            event = replace(event, handed_to=handed_to,
                            summary=f"{event.summary}: handed over to {handed_to}, "
                            "which judges this level and fires now")
        state.severity, state.reference, state.stated = "", None, None
        state.critical_since = None
        return self._notify(state, event, now)

    def _escalate(self, rule: Rule, record: StepRecord, state: AlertState, check: _Check,
                  now: float | None) -> AlertEvent:
        """One alert whose severity changes: a single event at the new severity (routed by
        it), saying why."""
        state.severity = Severity.CRITICAL.value
        event = self._event(rule, record, "firing", check, state.severity)
        why, condition = _critical_words(rule, state, check.value, record.step)
        if not why:
            why = f"firing for {record.step - (state.since_step or 0)} steps"
            condition = f"{rule.describe()}, firing for {rule.escalate_after} steps"
        event = replace(event, escalated_from=Severity.WARNING.value, condition=condition,
                        summary=f"{event.summary} (escalated to critical: {why})")
        state.held = False  # the escalation is its own trigger
        return self._notify(state, event, now)

    def _notify(self, state: AlertState, event: AlertEvent, now: float | None) -> AlertEvent:
        """Apply the per-hour bound: an event over it is stored, not sent; the last one sent
        says so."""
        if event.state == "resolved" and state.held:  # its firing was not sent: nor is this
            state.held = False
            return replace(event, notify=False)
        if now is None:  # no clock on the step (a bare record): nothing to bound by
            return event
        sent = state.sent
        while sent and now - sent[0] >= 3600.0:
            sent.popleft()
        limit = self.policy.per_hour
        if len(sent) >= limit:
            if event.state == "firing" and not event.repeat:
                state.held = True
            return replace(event, notify=False)
        sent.append(now)
        if len(sent) == limit:
            until = sent[0] + 3600.0
            event = replace(event, summary=(
                f"{event.summary} [rlmon: {limit} notifications of {event.alert} for this run "
                f"within the hour, the most it sends: further changes before "
                f"{_clock(until)} are stored, not sent]"))
        return event

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
                event = self._event(rule, record, "resolved", _Check(True, False, state.metric),
                                    state.severity or None)
                resolved.append(replace(event, value=None,
                                        summary=f"{event.summary} (the run restarted)"))
        return resolved

    @staticmethod
    def _event(rule: Rule, record: StepRecord, state: State, check: _Check,
               severity: str | None = None) -> AlertEvent:
        metric = check.metric or (rule.metric if rule.metric != ANY_METRIC else "")
        return AlertEvent(
            run=record.run,
            role=record.role,
            step=record.step,
            alert=rule.name,
            severity=severity or rule.severity.value,
            state=state,
            metric=metric,
            value=check.value if check.metric else record.metrics.get(metric),
            summary=rule.summary or rule.describe(),
            condition=rule.describe(),
            what_to_check=what_to_check(rule.condition, metric),
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
    for key, series in drift.prepare(engine.rules, ordered,
                                     lambda k: k not in engine.states).items():
        engine.states[key] = AlertState(ahead=series)
    for record in ordered:
        yield record, engine.evaluate(record)
