"""What crosses the aggregation tiers besides step messages: the answer to a batch, and a node
merger's batch of pre-merged step states."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlmon.service.aggregation.assembly import AddOutcome
from rlmon.service.aggregation.step_state import StepState
from rlmon.service.contract.records import show
from rlmon.service.contract.stop_decision import StopDecision

__all__ = ["IngestAck", "NodeBatch", "ReporterKey", "origin"]

ReporterKey = tuple[str, str, tuple[int, ...]]  # (run, role, rank as a tuple): one Reporter


@dataclass(slots=True)
class IngestAck:
    """What happened to one batch of messages.

    ``floors`` gives, per (run, role) of the batch, the step below which everything is finalized:
    a reporter keeps its messages of later steps, and resends them when ``incarnation`` changes
    (the aggregator restarted and lost its open steps). ``stops`` carries the service's stop
    decisions for the runs of the batch (run -> decision; :mod:`rlmon.service.contract.stop_decision`).
    """

    accepted: int = 0
    duplicates: int = 0
    late: int = 0
    rejected: int = 0
    finalized: int = 0
    errors: list[str] = field(default_factory=list)
    incarnation: str = ""
    floors: dict[tuple[str, str], int] = field(default_factory=dict)
    stops: dict[str, StopDecision] = field(default_factory=dict)

    def refuse(self, item: object, error: Exception, max_errors: int) -> None:
        """Count a rejected message or state, keeping its error (the first ``max_errors``)."""
        self.rejected += 1
        if len(self.errors) < max_errors:
            self.errors.append(f"{origin(item)}: {error}")

    def tally(self, outcome: str) -> None:
        """Count an accepted, duplicate or late message or state (an ``AddOutcome``)."""
        if outcome == AddOutcome.ACCEPTED:
            self.accepted += 1
        elif outcome == AddOutcome.DUPLICATE:
            self.duplicates += 1
        else:
            self.late += 1


@dataclass(slots=True)
class NodeBatch:
    """A node merger's drained step states, with what it refused since its previous batch.

    ``source`` is (node merger id, drain seq): a batch retried after its ack was lost is merged
    once. The counts are the messages the node merger rejected, took as late or as duplicates,
    so that the root's counters count every refusal of the tier. ``reporters`` carries the
    running (dropped, refused) counts of the node's Reporters that changed since the previous
    batch, by (run, role, rank), as their messages said them.
    """

    states: list[StepState]
    source: tuple[str, int] | None = None
    rejected: int = 0
    late: int = 0
    duplicates: int = 0
    reporters: dict[ReporterKey, tuple[int, int]] = field(default_factory=dict)


def origin(item: object) -> str:
    """``run/role step N`` of a message or state for an error line, whatever its fields hold."""
    run, role, step = (getattr(item, f, None) for f in ("run", "role", "step"))
    if isinstance(run, str) and isinstance(role, str) and len(run) + len(role) <= 200:
        return f"{run}/{role} step {show(step)}"
    return f"a {type(item).__name__}"
