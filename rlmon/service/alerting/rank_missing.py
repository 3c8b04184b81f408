"""``RankMissing`` in words: which ranks a step finalized without, how many of how many, what to
check and what to change (the engine's check and event call these)."""

from __future__ import annotations

from collections.abc import Mapping

from rlmon.service.contract.step_record import StepRecord
from rlmon.service.liveness.run_state import RankSeen, rank_label
from rlmon.service.metrics.rank import Rank

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


def detail(record: StepRecord, seen: Mapping[Rank, RankSeen] | None = None) -> str:
    """"Missing dp=3 (1 of 4 ranks) from step 12 on. Last heard: dp=3 in train/rollout on
    node-7 (...). To change: ..." for a step without every rank; ``seen``: where the liveness
    tracker last heard the ranks that fell silent (those it knows)."""
    missing = record.missing_ranks
    count = max(record.ranks_expected - record.ranks_reporting, len(missing))
    names = ", ".join(rank_label(r) for r in missing[:_SHOWN])
    more = count - min(len(missing), _SHOWN)
    if more > 0:
        names += f" and {more} more" if names else f"{more} ranks"
    heard = [_last_heard(seen[r], record.finalized_at) for r in missing[:_SHOWN]
             if seen and r in seen]
    where = f" Last heard: {'; '.join(heard)}." if heard else ""
    return (f"Missing {names or 'ranks'} ({count} of {record.ranks_expected} ranks) from step "
            f"{record.step} on.{where} {WHAT_TO_CHANGE}")


def _last_heard(seen: RankSeen, at: float | None) -> str:
    """"dp=3 in train/rollout on node-7 (Ray node 1a2b3c4d), 42 s before, after step 11"."""
    text = rank_label(seen.rank) + (f" in {seen.stage}" if seen.stage else " in no stage")
    if seen.host:
        text += f" on {seen.host}" + (f" (Ray node {seen.node[:8]})" if seen.node else "")
    if at is not None and at >= seen.heard:
        text += f", {at - seen.heard:.0f} s before"
    if seen.last_step is not None:
        text += f", after step {seen.last_step}"
    return text
