"""A run's alerts end with the run (docs/liveness.md, "How a run ends").

When a (run, role) finishes, every alert still firing on it is closed once, saying so
("critical, still firing when the run ended"): nothing is left to fix in a run that no longer
exists, and the runs list stops showing it as firing. The closing is marked
(``AlertEvent.ended_with_run``) so that no notification, report or page calls it resolved: the
run is over, not the condition; an escalated alert ends quoting its critical level. A run that
failed or was preempted keeps its alerts (its failure stays visible); a rerun under the same
name closes the last attempt's alerts itself (:meth:`~rlmon.service.alerting.engine.AlertEngine.evaluate`).
"""

from __future__ import annotations

from rlmon.service.alerting.alert_types import AlertEvent
from rlmon.service.alerting.engine import AlertEngine, level_before
from rlmon.service.metrics.spec import Severity

__all__ = ["close_with_run"]


def close_with_run(engine: AlertEngine, run: str, role: str, step: int | None,
                   at: float) -> list[AlertEvent]:
    """Resolve every alert of (run, role) still firing, saying the run ended with it firing;
    the resolved events (stored and notified like any other)."""
    events = []
    last = step if step is not None else engine.last_step.get((run, role), 0)
    attempt = engine.attempt_of(run, role)
    for rule in engine.rules:
        state = engine.state(run, role, rule.name)
        if state is None or not state.firing:
            continue
        severity, metric = state.severity or rule.severity.value, state.metric
        # an escalated alert ends as the critical incident it was: its level, not the warning's
        condition = (rule.describe_critical(level_before(rule, state))
                     if severity == Severity.CRITICAL.value != rule.severity.value else "")
        engine.judge(run, role, rule, False, last)
        state.reference = None
        events.append(engine.notified(AlertEvent(
            run=run, role=role, step=last, alert=rule.name, severity=severity, state="resolved",
            metric=metric, value=None, summary=rule.summary or rule.describe(),
            condition=condition or rule.describe(), attempt=attempt, ended_with_run=True), at))
    return events
