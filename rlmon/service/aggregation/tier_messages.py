"""What crosses the aggregation tiers besides step messages: a node merger's batch of
pre-merged step states (the answer to a batch is :mod:`rlmon.service.contract.acks`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlmon.service.aggregation.step_state import StepState
from rlmon.service.contract.heartbeat import Heartbeat

__all__ = ["NodeBatch", "ReporterKey"]

ReporterKey = tuple[str, str, tuple[int, ...]]  # (run, role, rank as a tuple): one Reporter


@dataclass(slots=True)
class NodeBatch:
    """A node merger's drained step states, with what it refused since its previous batch.

    ``source`` is (node merger id, drain seq): a batch retried after its ack was lost is merged
    once. The counts are the messages the node merger rejected, took as late or as duplicates,
    so that the root's counters count every refusal of the tier. ``reporters`` carries the
    running (dropped, refused) counts of the node's Reporters that changed since the previous
    batch, by (run, role, rank), as their messages said them.
    """

    #: The sealed, pre-merged states of the steps the node merger drained.
    states: list[StepState]
    #: (node merger id, drain seq); None: merged without the retry check.
    source: tuple[str, int] | None = None
    #: Messages the node merger rejected since its previous batch.
    rejected: int = 0
    #: Messages it took as late since its previous batch.
    late: int = 0
    #: Messages it took as duplicates since its previous batch.
    duplicates: int = 0
    #: (run, role, rank) -> the Reporter's running (dropped, refused) counts that changed.
    reporters: dict[ReporterKey, tuple[int, int]] = field(default_factory=dict)
    # the heartbeats of the node's Reporters since the previous batch (the latest per Reporter)
    heartbeats: list[Heartbeat] = field(default_factory=list)
