"""Where a firing early warning's metric is heading, stated when it fires and refreshed while it
holds (issue 39: at firing an early warning has often seen too few values of its departure to
calibrate a range on, and said nothing of where the metric was heading for the rest of the
incident).

The projection (:mod:`rlmon.service.alerting.projection`) is made from the rule's own window
when the rule fires, and again while it fires: at each of the first ``DENSE`` steps after the
firing, then at steps ``DENSE`` x 1.5^k after it (15, 22, 33, ... steps: a long incident costs a
few dozen projections, not one a step), and at any step once the stated range has passed
without the level reached. A new projection is stated (an update of the firing alert:
:attr:`~rlmon.service.alerting.alert_types.AlertEvent.repeat`, routed and sent as a re-send is,
not stored as a transition) where none was stated yet, or where the stated range no longer
holds (the new one lies wholly outside it). Only news is sent: a first statement, or the level
nearer than stated; a range that moved later (the departure slowing, a bump receding) is an
event that is not sent (``notify`` false), so a false alarm's updates do not ping again and
again. What was stated is kept in the rule's state
(:attr:`~rlmon.service.alerting.alert_types.AlertState.stated`) and saved with it, so a
restarted service does not state it again.
"""

from __future__ import annotations

from collections.abc import Sequence

from rlmon.service.alerting.alert_types import AlertState
from rlmon.service.alerting.projection import alert_projection
from rlmon.service.alerting.rules import Rule

__all__ = ["DENSE", "at_firing", "refreshed"]

DENSE = 10  # steps after the firing refreshed one by one (a departure calibrates in about 8)
_GROWTH = 1.5


def _state(state: AlertState, step: int, rule: Rule, rules: Sequence[Rule]) -> str:
    found = alert_projection(rule.metric, state.history, rules)
    if found is None:
        return ""
    state.stated = (step + round(found.earliest), step + round(found.latest))
    return found.describe()


def at_firing(rule: Rule, state: AlertState, rules: Sequence[Rule], step: int) -> str:
    """The heading stated as ``rule`` fires at ``step`` ("" when nowhere known)."""
    state.stated = None
    return _state(state, step, rule, rules) if state.history else ""


def _due(age: int) -> bool:
    if age <= DENSE:
        return True
    due = float(DENSE)
    while due < age:
        due *= _GROWTH
    return age == int(due)


def refreshed(rule: Rule, state: AlertState, rules: Sequence[Rule], step: int,
              ) -> tuple[str, bool]:
    """A new statement of where the firing ``rule``'s metric is heading at ``step`` ("" where
    none is due): where none was stated yet, or the stated range no longer holds; and whether
    it is news to send (none stated before, or the level nearer than stated: a range that moved
    later, the metric slower than said, is stated, not sent)."""
    if not state.history or state.since_step is None:
        return "", False
    stated = state.stated
    expired = stated is not None and step > stated[1]
    if not (expired or _due(step - state.since_step)):
        return "", False
    found = alert_projection(rule.metric, state.history, rules)
    if found is None:
        return "", False
    low, high = step + round(found.earliest), step + round(found.latest)
    if stated is not None and stated[0] <= high and low <= stated[1]:
        return "", False  # what was stated still holds
    state.stated = (low, high)
    return found.describe(), stated is None or high < stated[0]
