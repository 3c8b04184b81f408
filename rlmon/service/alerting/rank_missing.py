"""``RankMissing`` in words: which ranks a step finalized without, how many of how many, what to
check and what to change (the engine's check and event call these)."""

from __future__ import annotations

from rlmon.service.contract.step_record import StepRecord
from rlmon.service.liveness.run_state import rank_label

__all__ = ["WHAT_TO_CHECK", "detail"]

_SHOWN = 8  # missing ranks named one by one; more are counted

WHAT_TO_CHECK = (
    "the missing ranks' processes: are they alive (the run page's liveness, RunDied or RunFailed "
    "when they ended), stuck in a stage, or on a node that was lost or out of memory; their "
    "last heartbeat's stage and host are on the run page")

WHAT_TO_CHANGE = (
    "To change: restart the lost ranks or resume the run from its last checkpoint; an elastic "
    "job that shrank on purpose gives its Reporters the new world (world=...), so the ranks it "
    "left are no longer expected")


def detail(record: StepRecord) -> str:
    """"Missing dp=3 (1 of 4 ranks) at step 12. To change: ..." for a step without every rank."""
    missing = record.missing_ranks
    count = max(record.ranks_expected - record.ranks_reporting, len(missing))
    names = ", ".join(rank_label(r) for r in missing[:_SHOWN])
    more = count - min(len(missing), _SHOWN)
    if more > 0:
        names += f" and {more} more" if names else f"{more} ranks"
    return (f"Missing {names or 'ranks'} ({count} of {record.ranks_expected} ranks) from step "
            f"{record.step} on. {WHAT_TO_CHANGE}")
