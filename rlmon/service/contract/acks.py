"""The aggregator's answer to a batch of step messages (or a node merger's batch of states):
the reply half of the wire contract, which every sink and the Reporter's delivery read."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlmon.service.contract.records import show
from rlmon.service.contract.stop_decision import StopDecision

__all__ = ["AddOutcome", "IngestAck", "origin"]


class AddOutcome:
    """What became of one message or state that passed the contract's checks."""

    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    LATE = "late"


@dataclass(slots=True)
class IngestAck:
    """What happened to one batch of messages.

    ``floors`` gives, per (run, role) of the batch, the step below which everything is finalized:
    a reporter keeps its messages of later steps, and resends them when ``incarnation`` changes
    (the aggregator restarted and lost its open steps). ``stops`` carries the service's stop
    decisions for the runs of the batch (run -> decision; :mod:`rlmon.service.contract.stop_decision`).
    """

    #: Messages or states folded in.
    accepted: int = 0
    #: Already folded in before (a retry or a resend): not folded in again.
    duplicates: int = 0
    #: For a step already finalized: counted, not folded in.
    late: int = 0
    #: Refused by the contract's checks (each error in ``errors``).
    rejected: int = 0
    #: Steps the batch finalized.
    finalized: int = 0
    #: ``run/role step N: error`` of the first rejections (at most the aggregator's max_errors).
    errors: list[str] = field(default_factory=list)
    #: The answering aggregator's identity: a change means it restarted and lost its open steps.
    incarnation: str = ""
    #: (run, role) -> the step below which everything is finalized.
    floors: dict[tuple[str, str], int] = field(default_factory=dict)
    #: run -> the service's stop decision for it.
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


def origin(item: object) -> str:
    """``run/role step N`` of a message or state for an error line, whatever its fields hold."""
    run, role, step = (getattr(item, f, None) for f in ("run", "role", "step"))
    if isinstance(run, str) and isinstance(role, str) and len(run) + len(role) <= 200:
        return f"{run}/{role} step {show(step)}"
    return f"a {type(item).__name__}"
