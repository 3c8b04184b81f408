"""Liveness views into alert transitions: the time-based rules of the pack (docs/liveness.md).

Each (run, role, alert) keeps its state in the engine (which owns it: set through
:meth:`AlertEngine.judge`), saved in the history store like
every other alert's, so a restarted service that is told again that a run is stalled finds the
alert already firing and pages nothing twice. A stalled run that resumes resolves; a run that
finishes resolves whatever fired and never pages for having stopped. A firing event carries
its condition's onset; the service prices it (:mod:`rlmon.service.goodput.alert_costs`).
"""

from __future__ import annotations

from rlmon.service.alerting.alert_types import AlertEvent
from rlmon.service.alerting.conditions.liveness import TimedKind
from rlmon.service.alerting.conditions.registry import TIMED
from rlmon.service.alerting.engine import AlertEngine
from rlmon.service.alerting.rules import Rule
from rlmon.service.alerting.what_to_check import what_to_check
from rlmon.service.liveness.run_state import LivenessView, RunState, describe

__all__ = ["liveness_events", "liveness_firing"]

def _resolved_because(kind: TimedKind, view: LivenessView) -> str:
    """Why a liveness alert resolved, in the words of the state the run is in now."""
    state = view.state
    if state is RunState.FINISHED:
        return " (the run finished)"
    if state is RunState.FAILED:
        return " (the run failed)"
    if state is RunState.PREEMPTED:
        return " (the run was stopped by a signal)"
    if state is RunState.DEAD:
        return " (its processes are gone)"
    if state is RunState.FROZEN:
        return " (its processes still exist)"
    if kind.ends_a_run and view.rerun:
        return " (a rerun of the run reported)"
    return " (progress resumed)"


def _rules(engine: AlertEngine, role: str) -> list[Rule]:
    return [r for r in engine.rules if r.condition in TIMED
            and (r.roles is None or role in r.roles)]


def liveness_events(engine: AlertEngine, view: LivenessView) -> list[AlertEvent]:
    """The transitions ``view`` makes in the engine's liveness alert states (which it updates)."""
    events = []
    attempt = engine.attempt_of(view.run, view.role)
    step = view.last_step if view.last_step is not None else 0
    for rule in _rules(engine, view.role):
        kind = TIMED[rule.condition]  # what the condition means: rlmon.service.alerting.conditions
        holds = kind.holds(view, engine.is_firing(view.run, view.role, rule.name))
        repeat = False
        if not engine.judge(view.run, view.role, rule, holds, step):
            # a critical alert still firing is re-sent at the engine's repeat interval
            repeat = holds and engine.repeat_due(view.run, view.role, rule.name, view.at)
            if not repeat:
                continue
        resolved = "" if holds else _resolved_because(kind, view)
        if repeat:
            resolved = (f" (still firing: re-sent every "
                        f"{engine.policy.repeat_seconds / 3600:g} h)")
        events.append(engine.notified(AlertEvent(
            run=view.run, role=view.role, step=step, alert=rule.name,
            severity=rule.severity.value, state="firing" if holds else "resolved", metric="",
            value=kind.value(view), summary=(rule.summary or rule.describe())
            + resolved, condition=rule.describe(),
            what_to_check=what_to_check(rule.condition, ""), attempt=attempt,
            detail=describe(view) if holds else "",
            onset=kind.onset(view) if holds else None, repeat=repeat), view.at))
    return events


def liveness_firing(engine: AlertEngine, run: str, role: str) -> dict[str, str]:
    """The liveness alerts of (run, role) firing now: alert -> severity (for /metrics)."""
    out = {}
    for rule in _rules(engine, role):
        if engine.is_firing(run, role, rule.name):
            out[rule.name] = rule.severity.value
    return out
