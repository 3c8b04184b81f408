"""A long recorded series evaluated by the engine only where something can happen.

``rlmon diagnose`` of a million-step log asks each rule about each step, and at nearly every
step nothing happens: a threshold is not crossed, a detector's score stays low. A rule that is
*idle* (not firing, no step towards firing counted) changes at such a step only by counting it as
good (``false_steps``), and no other rule reads that count (a rule reads another's ``firing``
only, which an idle rule never changes). So, per rule, the steps where its check cannot hold are
found at once from the series' columns by the rule's condition kind (its batch half,
:meth:`~rlmon.service.alerting.conditions.kind.ConditionKind.quiet`: numpy masks; a baseline
rule's CUSUM score run over its whole series in one tight loop, from the same predictions as
:mod:`rlmon.service.alerting.baseline_batch`, in the same floating-point operations) and counted
in bulk; the engine itself (:meth:`AlertEngine.evaluate_rules`) judges the rest, in step order
and rule order, with the state it would have had. A rule that is pending or firing is judged at
every step; a rule whose kind has no batch half is judged at every step. The events, steps
and final states are the live engine's (``tests/service/alerting/test_batch_equals_live.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from rlmon.service.alerting.alert_types import AlertEvent, AlertState
from rlmon.service.alerting.conditions.kind import Columns, ColumnSource
from rlmon.service.alerting.conditions.registry import CONDITIONS
from rlmon.service.alerting.engine import AlertEngine
from rlmon.service.contract.step_record import StepRecord

__all__ = ["ColumnSeries", "evaluate_quietly"]


class ColumnSeries(ColumnSource, Protocol):
    """One (run, role)'s steps in increasing order (attempt 0), by column and as records."""

    @property
    def run(self) -> str: ...

    @property
    def role(self) -> str: ...

    def record(self, index: int) -> StepRecord: ...


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
    columns = Columns(series)
    # each rule's kind says where its check cannot hold (rlmon.service.alerting.conditions)
    skippers = [CONDITIONS[rule.condition].quiet(rule, states[rule.name], columns)
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

