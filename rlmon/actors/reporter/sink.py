"""Where a Reporter's step messages go, and the Reporters still open in this process.

A sink takes a batch of :class:`~rlmon.service.contract.step_message.StepMessage` s and returns once they are
accepted (or raises to be retried later). The runtime's Ray sink lives in
:mod:`rlmon.actors.runtime`; :class:`LocalSink` runs the same assembler in-process. The registry
of open senders lets the runtime's exit hook flush every Reporter without importing the Reporter.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Protocol

from rlmon.service.aggregation.assembly import StepAssembler
from rlmon.service.aggregation.tier_messages import IngestAck
from rlmon.service.contract.records import ContractError
from rlmon.service.contract.step_message import StepMessage
from rlmon.service.contract.step_record import StepRecord

__all__ = ["LocalSink", "ReportSink", "SinkClosed", "close_open_senders", "track_sender"]


class ReportSink(Protocol):
    """Where step messages go. ``send`` returns once they are accepted, or raises to retry later.

    It may return an :class:`~rlmon.service.aggregation.aggregator.IngestAck` (``incarnation`` and
    ``floors``); the Reporter then keeps the messages of steps not yet finalized and resends them
    to a restarted aggregator.
    """

    def send(self, messages: Sequence[StepMessage]) -> IngestAck | None: ...


class SinkClosed(RuntimeError):
    """Raised by a sink that can never deliver again (Ray shut down for good): the Reporter
    counts what it holds as dropped, says so once, and stops sending."""


class LocalSink:
    """An in-process sink feeding a step assembler: the Reporter without Ray (tests, notebooks).

    Finalized steps collect in ``records``; ``on_record`` sees each as it finalizes.
    """

    def __init__(
        self,
        assembler: StepAssembler | None = None,
        on_record: Callable[[StepRecord], None] | None = None,
    ) -> None:
        self.assembler = assembler if assembler is not None else StepAssembler()
        self.records: list[StepRecord] = []
        self.on_record = on_record
        self._lock = threading.Lock()

    def send(self, messages: Sequence[StepMessage]) -> IngestAck:
        """Add the messages; one that breaks the contract is refused and counted in the ack, as
        the aggregator does (raising would make the Reporter retry it forever)."""
        ack = IngestAck()
        with self._lock:
            for msg in messages:
                try:
                    outcome, record = self.assembler.add_message(msg)
                except ContractError as exc:
                    ack.refuse(msg, exc, max_errors=20)
                    continue
                ack.tally(outcome)
                if record is not None:
                    self.records.append(record)
                    if self.on_record is not None:
                        self.on_record(record)
        return ack

    def finalize_all(self) -> list[StepRecord]:
        with self._lock:
            done = self.assembler.finalize_all()
            self.records.extend(done)
            return list(done)


class _Sender(Protocol):
    def close(self, timeout: float = ...) -> None: ...


# Every sender (Reporter) not yet closed, so that interpreter exit flushes them while Ray is up.
_OPEN: weakref.WeakSet[_Sender] = weakref.WeakSet()
_OPEN_LOCK = threading.Lock()


def track_sender(sender: _Sender, open_: bool = True) -> None:
    """Note a sender as open (or, with ``open_`` false, as closed)."""
    with _OPEN_LOCK:
        if open_:
            _OPEN.add(sender)
        else:
            _OPEN.discard(sender)


def close_open_senders(timeout: float = 10.0) -> None:
    """Flush and close every open sender of this process (the runtime's exit hook calls it);
    ``timeout`` bounds the whole wait, not each sender's."""
    deadline = time.monotonic() + timeout
    with _OPEN_LOCK:
        senders = list(_OPEN)
    for sender in senders:
        sender.close(max(0.0, deadline - time.monotonic()))
