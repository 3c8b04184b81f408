"""Finalized records on their way to the service: the aggregator's outbox.

A record stays (in the watermark store too, when one is given) until the service acknowledges
it, so a restart loses no finalized step; it is handed over in step order per (run, role).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rlmon.service.aggregation.assembly import StepAssembler
from rlmon.service.aggregation.watermark import WatermarkStore
from rlmon.service.contract.step_record import StepIdentity, StepRecord

__all__ = ["RecordOutbox"]


class RecordOutbox:
    """The finalized records the service has not acknowledged yet."""

    def __init__(self, assembler: StepAssembler, store: WatermarkStore | None) -> None:
        self.assembler, self.store = assembler, store
        self.records: dict[StepIdentity, StepRecord] = {}
        if store is not None:
            self.records.update({r.identity: r for r in store.undelivered(limit=1_000_000)})

    def __len__(self) -> int:
        return len(self.records)

    def streams(self) -> set[tuple[str, str]]:
        """The (run, role) of every record waiting: their state must stay in memory."""
        return {identity[:2] for identity in self.records}

    def add(self, records: Iterable[StepRecord], now: float) -> None:
        """Records just finalized, committed with the finalized steps they close (the store's
        one transaction: a restart finalizes none of them twice, and loses none)."""
        records = list(records)
        if self.store is not None:
            self.store.commit(self.assembler.finalized, records, now)
        for record in records:
            self.records[record.identity] = record

    def _lowest_open(self) -> dict[tuple[str, str], int]:
        low: dict[tuple[str, str], int] = {}
        for run, role, step in self.assembler.open:
            known = low.get((run, role))
            if known is None or step < known:
                low[(run, role)] = step
        return low

    def pending(self, limit: int = 512) -> list[StepRecord]:
        """Finalized records ready for the service, in step order per (run, role).

        A record whose (run, role) still has an earlier step open is held back (it stays in the
        durable outbox) until that step finalizes, which its deadline guarantees: the service's
        alerts then see every stream in increasing step order, whatever order steps finished in.
        """
        low = self._lowest_open()
        ready = sorted((r for r in self.records.values() if not self._held(r, low)),
                       key=lambda r: r.identity)
        return ready[:limit]

    def held(self) -> int:
        """Finalized records waiting for an earlier open step of their (run, role)."""
        low = self._lowest_open()
        return sum(1 for r in self.records.values() if self._held(r, low))

    def _held(self, record: StepRecord, low: dict[tuple[str, str], int]) -> bool:
        """Whether an earlier step of the record's attempt is still open (open steps always
        belong to the stream's current attempt; an older attempt's records never wait)."""
        stream = (record.run, record.role)
        return (record.attempt == self.assembler.attempts.get(stream, 0)
                and record.step >= low.get(stream, record.step + 1))

    def delivered(self, records: Sequence[StepRecord]) -> None:
        """The service acknowledged ``records``: they leave the outbox and the store."""
        for record in records:
            self.records.pop(record.identity, None)
        if self.store is not None:
            self.store.delivered(records)
