"""What an aggregator counted: the snapshot it publishes to the service with finalized steps.

One frozen dataclass crosses the Ray boundary as is (Ray pickles it) and is read by attribute,
so a misspelt field fails at once instead of reading 0 in silence. The service sums the shards'
snapshots (:meth:`AggregatorStats.total`) and exports the sum as the ingest counters
(``rlmon_partials_*_total`` and kin): one type for what the aggregators counted, from the
assembler's running counts (:class:`~rlmon.service.aggregation.assembly.AssemblyCounters`, its
builder) to /metrics.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields

__all__ = ["AggregatorStats"]


@dataclass(frozen=True, slots=True)
class AggregatorStats:
    """One aggregator's counters at one moment (totals since it started, unless said)."""

    #: Records and step messages folded into an open step.
    accepted: int = 0
    #: Records refused by the contract's checks (each counted once, its error in the ack).
    rejected: int = 0
    #: Records already folded in (a retry, a resend the node merger could not recognise).
    duplicates: int = 0
    #: Records for a step already finalized (a rank past the deadline).
    late: int = 0
    #: Metric partials taken in (a columnar block counts one per metric).
    partials: int = 0
    #: Steps finalized, complete or not.
    steps_finalized: int = 0
    #: Steps finalized with ranks missing (deadline, end of input).
    steps_incomplete: int = 0
    #: New attempts of a (run, role): a rerun under an existing run name.
    restarts: int = 0
    #: Resends (after an aggregator restart) of steps already finalized.
    resent: int = 0
    #: Steps open now.
    open_steps: int = 0
    #: This aggregator process's identity (a restarted actor has a new one).
    incarnation: str = ""
    #: Finalized records the service has not acknowledged yet (the outbox).
    undelivered: int = 0
    #: Finalized records waiting for an earlier open step of their (run, role).
    held_out_of_order: int = 0
    #: Step messages Reporters dropped (full buffer), their running counts summed.
    reporter_dropped: int = 0
    #: Statistics Reporters refused before sending, their running counts summed.
    reporter_refused: int = 0
    #: Median seconds from a step's first record to its finalization (recent steps; None: none).
    finalize_latency_p50: float | None = None
    #: Streams (run, role) whose state is in memory now.
    streams: int = 0
    #: Streams whose state left memory (quiet, or crowded out); it is read back when they report.
    streams_forgotten: int = 0
    #: Streams the watermark store forgot (retention).
    streams_pruned: int = 0
    #: Metric names whose form was forgotten (unused for two rotations).
    names_forgotten: int = 0
    #: Failed deliveries to the service (the actor's; 0 where no actor delivers).
    delivery_errors: int = 0

    @classmethod
    def total(cls, shards: Iterable[AggregatorStats]) -> AggregatorStats:
        """The shards' counts summed, field by field; what does not add up (an incarnation, a
        median latency) is left at its default."""
        shards = list(shards)
        return cls(**{f.name: sum(getattr(s, f.name) for s in shards) for f in _COUNTS})

    @property
    def removed(self) -> dict[str, int]:
        """What left memory or the store, by kind (never refused data)."""
        return {"streams_forgotten": self.streams_forgotten,
                "streams_pruned": self.streams_pruned,
                "names_forgotten": self.names_forgotten}

    def said_without_a_step(self) -> tuple[int, ...]:
        """The counters that can change while no step finalizes (a change is published alone)."""
        return (self.late, self.rejected, self.duplicates, self.restarts, self.resent,
                self.reporter_dropped)


_COUNTS = tuple(f for f in fields(AggregatorStats) if f.type in ("int", int))
