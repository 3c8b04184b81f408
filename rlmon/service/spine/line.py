"""The spine: the line of stages a batch walks, each entered once (docs/design.md, "The spine").

::

    batch (steps | liveness views)
      -> StreamMemory.admit   new steps only; their streams back in memory
      -> AlertJudge.judge     alerts, priced, stops decided (StopDesk), explained -> Verdict
      -> Sinks.show           exporter, sanity: what the service shows, before the write
      -> Commit.store         one history transaction; the recent transitions
      -> Sinks.record         OTLP, forward, goodput, one's own: once the batch is stored
      -> StreamMemory.settle  what left memory during the batch; retention
    (the service's lock released)
      -> Commit.deliver       the owed notifications into the outbox, delivery woken

No stage calls another stage, except the judge asking the stop desk between pricing an alert
and explaining it (a stop is decided on the priced transition, and its notification says so).
The sinks hear the verdict in two phases (:mod:`rlmon.service.spine.sink` says which and why):
none of them reads what the commit produces, so the order is the service's before the spine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

from rlmon.service.aggregation.aggregator_stats import AggregatorStats
from rlmon.service.alerting.alert_types import AlertEvent
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.liveness.run_state import LivenessView
from rlmon.service.spine.commit import Commit
from rlmon.service.spine.judge import AlertJudge
from rlmon.service.spine.memory import StreamMemory
from rlmon.service.spine.sink import Sinks
from rlmon.service.spine.stops import StopDesk
from rlmon.service.spine.verdict import Verdict

__all__ = ["Spine"]


class Spine:
    """The stages, in order; :meth:`carry` walks a batch through them (under the service's
    lock) and :meth:`deliver` finishes it (after)."""

    def __init__(self, memory: StreamMemory, judge: AlertJudge, commit: Commit, sinks: Sinks,
                 clock: Callable[[], float]) -> None:
        self.memory, self.judge, self.commit, self.sinks = memory, judge, commit, sinks
        self.stops: StopDesk = judge.stops
        self._clock = clock

    def carry(self, kind: Literal["steps", "liveness"], records: Sequence[StepRecord] = (),
              views: Sequence[LivenessView] = (), shard: int = 0,
              stats: AggregatorStats | None = None) -> Verdict:
        now = self._clock()
        fresh, seen = self.memory.admit(records, views, now)
        verdict = self.judge.judge(kind, fresh, seen, now, shard, stats)
        self.sinks.show(verdict)
        self.commit.store(verdict)
        self.sinks.record(verdict)
        self.memory.settle(verdict)
        return verdict

    def deliver(self, verdict: Verdict) -> list[AlertEvent]:
        """Hand the verdict's notifications over; returns its transitions."""
        self.commit.deliver(verdict)
        return verdict.events
