"""The collector tier's delivery: dedupe by step, atomic validated merges, retried batches
counted once, and reporters resending through a collector after the root restarts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from rlmon.actors.reporter import Reporter
from rlmon.service.aggregation.aggregator import AggregatorCore
from rlmon.service.aggregation.node_merge import NodeMerger
from rlmon.service.aggregation.tier_messages import NodeBatch
from rlmon.service.aggregation.watermark import WatermarkStore
from rlmon.service.contract.acks import IngestAck
from rlmon.service.contract.step_message import StepMessage, columns_from_states
from rlmon.service.metrics.rank import Rank, World
from rlmon.service.metrics.spec import Form


def _msg(step: int, dp: int, seq: int, world: World = World(dp=2), loss: float = 1.0,  # noqa: B008
         ) -> StepMessage:
    cols = columns_from_states({"actor/loss": (Form.MEAN, (loss, 1.0))})
    return StepMessage("r", "actor", step, Rank(dp=dp), world, seq, 0.0, cols)


def test_a_restarted_worker_reusing_seq_is_not_taken_for_a_resend() -> None:
    c = NodeMerger()
    assert c.add(_msg(0, 0, seq=1))
    assert c.add(_msg(5, 0, seq=1))  # the worker restarted: seq is 1 again, the step is new
    assert not c.add(_msg(5, 0, seq=1))  # a real resend
    assert c.duplicates == 1
    assert [s.step for s in c.drain()] == [0, 5]


def test_a_batch_is_validated_whole_and_a_retry_counts_once() -> None:
    """A state whose world disagrees is rejected alone (nothing half merged, no exception), and
    the same batch sent again (its ack lost to a timeout) is not merged twice."""
    c1, c2 = NodeMerger(), NodeMerger()
    c1.add(_msg(0, 0, seq=1, loss=1.0))
    c1.add(_msg(1, 0, seq=2, loss=5.0))
    c2.add(_msg(0, 1, seq=1, world=World(dp=3)))  # misconfigured world
    root = AggregatorCore()
    batch1 = c1.next_batch()
    batch2 = c2.next_batch()
    assert batch1 is not None and batch2 is not None
    for _ in range(3):  # retries
        ack = root.merge_batch(batch1)
    assert isinstance(ack, IngestAck) and ack.duplicates == 2
    bad = root.merge_batch(batch2)
    assert bad.rejected == 1 and "world" in bad.errors[0]
    c1.add(_msg(1, 1, seq=2, loss=1.0))
    more = c1.next_batch()
    assert more is not None
    root.merge_batch(more)
    root.finalize_all()
    got = {r.step: r for r in root.pending_records()}
    assert got[0].metrics["actor/loss"] == 1.0 and not got[0].complete
    # (5 + 1) / 2; rank 0's state merged three times would give (15 + 1) / 4
    assert got[1].metrics["actor/loss"] == 3.0 and got[1].complete


class _Tier:
    """A reporter's sink through one node merger to the root, in process (no Ray)."""

    def __init__(self, root: AggregatorCore) -> None:
        self.root, self.merger = root, NodeMerger()

    def _forward(self) -> None:
        batch = self.merger.next_batch()
        if batch is not None:
            self.merger.merged(batch, self.root.merge_batch(batch))

    def send(self, messages: Sequence[StepMessage]) -> IngestAck:
        accepted = sum(self.merger.add(m) for m in messages)
        self._forward()
        return self.merger.ack(messages, accepted)

    def probe(self, run: str, role: str) -> IngestAck:
        self.merger.learn(self.root.merge_batch(NodeBatch([])))
        return self.merger.ack([], 0)


def test_reporters_resend_through_a_collector_after_the_root_restarts(tmp_path: Path) -> None:
    db = tmp_path / "watermark-0.sqlite"
    tier = _Tier(AggregatorCore(store=WatermarkStore(db)))
    reps = [Reporter("r", "actor", rank={"dp": i}, world={"dp": 2}, sink=tier,
                     step_seconds=False) for i in range(2)]
    for step in range(2):
        for rep in reps:
            rep.record("rollout/tokens", sum=1.0)
            rep.end_step(step)
    reps[0].record("rollout/tokens", sum=1.0)
    reps[0].end_step(2)
    assert all(rep.flush(30) for rep in reps)
    tier.root = AggregatorCore(store=WatermarkStore(db))  # the root restarts; step 2 is lost
    assert reps[0].flush(30)
    assert reps[0].resent >= 1
    reps[1].record("rollout/tokens", sum=1.0)
    reps[1].end_step(2)
    assert reps[1].flush(30)
    records = {r.step: r for r in tier.root.pending_records()}
    assert records[2].complete and records[2].metrics["rollout/tokens"] == 2.0
    for rep in reps:
        rep.close()


def test_reporter_drop_and_refusal_counts_cross_the_tier() -> None:
    """A Reporter's running dropped/refused counts reach the root through a node merger, as
    they do directly; a retried batch does not count them twice (they are running totals)."""
    merger, root = NodeMerger(), AggregatorCore()
    merger.add(replace(_msg(0, 0, seq=1), dropped=2, refused=3))
    merger.add(replace(_msg(0, 1, seq=1), refused=1))
    merger.add(replace(_msg(1, 0, seq=2), dropped=2, refused=5))  # rank 0 refused two more
    batch = merger.next_batch()
    assert batch is not None
    for _ in range(2):
        root.merge_batch(batch)
    stats = root.stats()
    assert (stats.reporter_dropped, stats.reporter_refused) == (2, 5 + 1)
    assert merger.next_batch() is None  # nothing new: no empty batch
