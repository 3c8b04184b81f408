"""The conditions judged by time on the aggregator's clock (:mod:`rlmon.service.liveness`),
never by a step's values: a run stalled, dead, failed, preempted or frozen, a rank stuck in a
stage, steps far slower than the run's baseline. Each says whether a liveness view makes it hold,
the value an alert quotes and when the condition began (where its cost runs from); the alerts
are :mod:`rlmon.service.alerting.liveness_alerts`.
"""

from __future__ import annotations

from typing import ClassVar

from rlmon.service.alerting.alert_types import AlertState
from rlmon.service.alerting.conditions.kind import (
    NOT_APPLICABLE,
    Advance,
    Check,
    Columns,
    Condition,
    ConditionKind,
    Export,
    PromQL,
    RlmonOnly,
    RuleLike,
    never_judged,
)
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.export import series
from rlmon.service.liveness.run_state import LivenessView, RunState

__all__ = ["TIMED_KINDS", "TimedKind"]

_NOT_FINISHED = f'unless on(run, role) {series.RUN_STATE.name}{{state="finished"}} == 1'


def _state_is(state: str) -> str:
    return f'{series.RUN_STATE.name}{{state="{state}"}} == 1'


class TimedKind(ConditionKind):
    """A condition of a run's liveness; ``words``: it in words; ``expression``: PromQL (with
    the caveat above it), or why rlmon alone judges it."""

    by_time = True
    ends_a_run: ClassVar[bool] = False  # said by the ranks' ends (a rerun resolves it)
    words = ""
    expression: PromQL | RlmonOnly = RlmonOnly.OPEN_SPANS

    def holds(self, view: LivenessView, firing: bool) -> bool:
        """Whether ``view`` makes the condition hold (``firing``: it fires now)."""
        raise NotImplementedError

    def value(self, view: LivenessView) -> float | None:
        """The value its alert quotes: by default the seconds without progress."""
        return view.idle_seconds

    def onset(self, view: LivenessView) -> float:
        """When the condition began (unix seconds), where its cost runs from: by default the
        last step (progress stopped there)."""
        return view.at - view.idle_seconds

    def check(self, rule: RuleLike, record: StepRecord, state: AlertState) -> Check:
        return NOT_APPLICABLE  # judged by time, on the liveness timer (ServiceCore.liveness)

    def quiet(self, rule: RuleLike, state: AlertState, columns: Columns) -> Advance:
        return never_judged(columns)

    def promql(self, rule: RuleLike) -> Export:
        return self.expression

    def describe(self, rule: RuleLike) -> str:
        return self.words


class RunStalled(TimedKind):
    condition = Condition.RUN_STALLED
    words = "no step finalized for max(k x the typical step period, a floor) (config liveness)"
    # Prometheus judges the stall itself from the exported timestamps (rlmon's threshold, its
    # max(k x period, floor), is exported beside them), so it pages even if rlmon's alerting
    # path does not; a finished run never pages
    expression = PromQL(
        f"time() - {series.LAST_STEP_TIME.name} > {series.STALL_THRESHOLD.name} {_NOT_FINISHED}",
        "judged from the exported step timestamps and rlmon's stall threshold; rlmon's own "
        "alert also says where each rank is stuck")

    def holds(self, view: LivenessView, firing: bool) -> bool:
        # a stalled run whose processes then die stays stalled (RunDied fires beside it); a
        # frozen one past the stall threshold is a stall too
        state = view.state
        return state is RunState.STALLED or (state is RunState.DEAD and firing) or (
            state is RunState.FROZEN and (firing or view.overdue))


class StageStuck(TimedKind):
    condition = Condition.STAGE_STUCK
    words = "one rank far past its usual time in a stage while the others wait"
    expression = RlmonOnly.OPEN_SPANS

    def holds(self, view: LivenessView, firing: bool) -> bool:
        return view.stuck is not None and view.state not in (RunState.DEAD, RunState.FINISHED)

    def value(self, view: LivenessView) -> float | None:
        return view.at - view.stuck.since if view.stuck is not None else view.idle_seconds

    def onset(self, view: LivenessView) -> float:
        """A stuck rank's entry into its stage."""
        return view.stuck.since if view.stuck is not None else super().onset(view)


class RunDied(TimedKind):
    condition = Condition.RUN_DIED
    words = "every Reporter of the run silent without closing"
    # dead vs hung needs the per-rank heartbeats, which are not exported: rlmon's state says it
    expression = PromQL(_state_is("dead"),
                        "rlmon's liveness state: telling a dead run from a hung one takes the "
                        "per-rank heartbeats, which are not exported")

    def holds(self, view: LivenessView, firing: bool) -> bool:
        return view.state is RunState.DEAD


class _Ended(TimedKind):
    """A run whose ranks' processes ended (said by their closing heartbeats)."""

    ends_a_run = True

    def value(self, view: LivenessView) -> float | None:
        return float(len(view.ends))  # ranks that ended badly

    def onset(self, view: LivenessView) -> float:
        """The end: its GPUs idle (or released) from there on."""
        return view.ended_at if view.ended_at else super().onset(view)


class RunFailed(_Ended):
    condition = Condition.RUN_FAILED
    words = "a rank's process ended by an exception, a non-zero exit or a fatal signal"
    # how a process ended and whether a silent one exists are said by the Reporters and the
    # process probe, not exported: rlmon's state says them
    expression = PromQL(_state_is("failed"),
                        "rlmon's liveness state (a rank's closing heartbeat said how it ended)")

    def holds(self, view: LivenessView, firing: bool) -> bool:
        failed = [e for e in view.ends if not e.stop]  # on the roles whose own ranks failed
        if failed and view.failed_roles and all(e.source for e in failed) and not firing:
            # Ray's account of ranks torn down with a run whose other role already said its
            # own failure (a driver's exception carries the rank's): one page, not two
            return False
        return view.state is RunState.FAILED and bool(failed)


class RunPreempted(_Ended):
    condition = Condition.RUN_PREEMPTED
    words = "the run's processes stopped by a signal from outside (SIGTERM, SIGINT)"
    expression = PromQL(_state_is("preempted"),
                        "rlmon's liveness state (ranks stopped by SIGTERM, SIGINT)")

    def holds(self, view: LivenessView, firing: bool) -> bool:
        return view.state is RunState.PREEMPTED and bool(view.ends)


class RunFrozen(TimedKind):
    condition = Condition.RUN_FROZEN
    words = "every Reporter of the run silent while its processes still exist"
    expression = PromQL(_state_is("frozen"),
                        "rlmon's liveness state (silent ranks whose processes exist)")

    def holds(self, view: LivenessView, firing: bool) -> bool:
        return view.state is RunState.FROZEN

    def onset(self, view: LivenessView) -> float:
        """The last thing heard from it, or its last step."""
        return max(view.last_heard or view.since, view.last_step_at or 0.0)


class StepTimeRegression(TimedKind):
    condition = Condition.STEP_TIME_REGRESSION
    words = "step time far above the run's own baseline, the run still progressing"
    expression = RlmonOnly.OPEN_SPANS

    def holds(self, view: LivenessView, firing: bool) -> bool:
        return view.state is RunState.SLOW

    def value(self, view: LivenessView) -> float | None:
        return view.slow_ratio

    def onset(self, view: LivenessView) -> float:
        """The slow run's entry into the slow state."""
        return view.since


TIMED_KINDS: tuple[TimedKind, ...] = (RunStalled(), StageStuck(), RunDied(), RunFailed(),
                                      RunPreempted(), RunFrozen(), StepTimeRegression())
