"""The aggregator's durable memory: which steps are finalized, and records not yet delivered.

Finalizing a step and queueing its record happen in one SQLite transaction, so after a restart the
aggregator neither finalizes a step twice (the watermark) nor loses one it finalized but had not
handed to the service yet (the outbox, redelivered until acknowledged).
"""

from __future__ import annotations

import json
import pickle
import threading
from collections.abc import Iterable
from pathlib import Path

from rlmon.service.assembly import FinalizedSteps
from rlmon.service.sqlite_db import open_database
from rlmon.service.step import StepRecord

__all__ = ["WatermarkStore"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS watermark (
    run TEXT NOT NULL, role TEXT NOT NULL, floor INTEGER NOT NULL, steps TEXT NOT NULL,
    PRIMARY KEY (run, role));
CREATE TABLE IF NOT EXISTS record_outbox (
    run TEXT NOT NULL, role TEXT NOT NULL, step INTEGER NOT NULL, record BLOB NOT NULL,
    PRIMARY KEY (run, role, step));
"""


class WatermarkStore:
    """SQLite file (or ``:memory:``) holding finalized-step watermarks and the record outbox."""

    def __init__(self, path: str | Path = ":memory:") -> None:
        self._db = open_database(path, _SCHEMA)
        self._lock = threading.Lock()

    def load(self) -> dict[tuple[str, str], FinalizedSteps]:
        out: dict[tuple[str, str], FinalizedSteps] = {}
        for run, role, floor, steps in self._db.execute(
            "SELECT run, role, floor, steps FROM watermark"
        ):
            done = FinalizedSteps.restore(floor, json.loads(steps))
            out[(run, role)] = done
        return out

    def commit(
        self, finalized: dict[tuple[str, str], FinalizedSteps], records: Iterable[StepRecord]
    ) -> None:
        """Persist the watermark of every stream touched by ``records`` and queue the records."""
        records = list(records)
        if not records:
            return
        streams = {(r.run, r.role) for r in records}
        with self._lock:
            self._db.execute("BEGIN")
            try:
                for run, role in streams:
                    done = finalized[(run, role)]
                    self._db.execute(
                        "INSERT OR REPLACE INTO watermark VALUES (?, ?, ?, ?)",
                        (run, role, done.floor, json.dumps(done.intervals())),
                    )
                self._db.executemany(
                    "INSERT OR REPLACE INTO record_outbox VALUES (?, ?, ?, ?)",
                    [(r.run, r.role, r.step, pickle.dumps(r)) for r in records],
                )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def undelivered(self, limit: int = 1000) -> list[StepRecord]:
        with self._lock:
            rows = self._db.execute(
                "SELECT record FROM record_outbox ORDER BY run, role, step LIMIT ?", (limit,)
            ).fetchall()
        return [pickle.loads(blob) for (blob,) in rows]

    def delivered(self, records: Iterable[StepRecord]) -> None:
        with self._lock:
            self._db.executemany(
                "DELETE FROM record_outbox WHERE run = ? AND role = ? AND step = ?",
                [(r.run, r.role, r.step) for r in records],
            )

    def close(self) -> None:
        with self._lock:
            self._db.close()
