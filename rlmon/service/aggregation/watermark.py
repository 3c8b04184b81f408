"""The aggregator's durable memory: which steps are finalized, and records not yet delivered.

Finalizing a step and queueing its record happen in one SQLite transaction, so after a restart the
aggregator neither finalizes a step twice (the watermark) nor loses one it finalized but had not
handed to the service yet (the outbox, redelivered until acknowledged).

Outbox records are stored as the replay line's JSON (plus the timing fields), never pickled: a
planted state file can at worst hold bad records, which are skipped, not run code.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rlmon.service.aggregation.finalized_steps import FinalizedSteps
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.contract.timeline import RankTimeline, find_straggler
from rlmon.service.metrics.nonfinite import NONFINITE_VALUES
from rlmon.service.metrics.rank import Rank
from rlmon.service.metrics.ranked_forms import json_score
from rlmon.service.storage.sqlite_db import open_database

log = logging.getLogger(__name__)

__all__ = ["WatermarkStore", "decode_record", "encode_record"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS watermark (
    run TEXT NOT NULL, role TEXT NOT NULL, floor INTEGER NOT NULL, steps TEXT NOT NULL,
    PRIMARY KEY (run, role));
CREATE TABLE IF NOT EXISTS record_outbox (
    run TEXT NOT NULL, role TEXT NOT NULL, step INTEGER NOT NULL, record BLOB NOT NULL,
    PRIMARY KEY (run, role, step));
CREATE TABLE IF NOT EXISTS step_outbox (
    run TEXT NOT NULL, role TEXT NOT NULL, attempt INTEGER NOT NULL, step INTEGER NOT NULL,
    record BLOB NOT NULL, PRIMARY KEY (run, role, attempt, step));
CREATE TABLE IF NOT EXISTS streams (
    run TEXT NOT NULL, role TEXT NOT NULL, attempt INTEGER NOT NULL, last_finalized REAL,
    PRIMARY KEY (run, role));
CREATE TABLE IF NOT EXISTS liveness (
    run TEXT NOT NULL, role TEXT NOT NULL, data TEXT NOT NULL, PRIMARY KEY (run, role));
"""
# record_outbox is the pre-attempt outbox: its rows move to step_outbox (attempt 0) on open.


def encode_record(record: StepRecord) -> str:
    """The record as JSON: the replay line (NaN/Inf through ``nonfinite``) and its timings."""
    line = record.to_json()
    line["first_seen"] = record.first_seen
    line["finalized_at"] = record.finalized_at
    line["time"] = record.time
    if record.timelines or record.timelines_cut:
        line["timelines"] = [t.to_json() for t in record.timelines]
        line["timelines_cut"] = record.timelines_cut
    if record.rank_extremes:
        line["rank_extremes"] = {name: [json_score(lo), json_score(hi)]
                                 for name, (lo, hi) in record.rank_extremes.items()}
    if record.samples:
        line["samples"] = {name: [[json_score(s), i, p] for s, i, p in items]
                           for name, items in record.samples.items()}
    return json.dumps(line, allow_nan=False, separators=(",", ":"))


def _score(value: Any) -> float:
    return NONFINITE_VALUES[value] if isinstance(value, str) else float(value)


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def decode_record(text: str | bytes) -> StepRecord:
    """Inverse of :func:`encode_record`; raises ValueError (or KeyError/TypeError) on bad input."""
    obj = json.loads(text)
    nonfinite = obj.get("nonfinite", {})
    metrics: dict[str, float] = {}
    for name, value in obj["metrics"].items():
        if value is None:
            if name not in nonfinite:
                continue
            metrics[name] = NONFINITE_VALUES[nonfinite[name]]
        else:
            metrics[name] = float(value)
    return StepRecord(
        run=str(obj["run"]), role=str(obj["role"]), step=int(obj["step"]),
        complete=bool(obj["complete"]), ranks_expected=int(obj["ranks_expected"]),
        ranks_reporting=int(obj["ranks_reporting"]),
        missing_ranks=tuple(Rank(**{k: int(v) for k, v in r.items()})
                            for r in obj["missing_ranks"]),
        metrics=metrics, replica_mismatches=tuple(obj.get("replica_mismatches", ())),
        first_seen=_optional_float(obj.get("first_seen")),
        finalized_at=_optional_float(obj.get("finalized_at")),
        time=_optional_float(obj.get("time")),
        attempt=int(obj.get("attempt", 0)),
        timelines=(timelines := tuple(RankTimeline.from_json(t)
                                      for t in obj.get("timelines", ()))),
        timelines_cut=int(obj.get("timelines_cut", 0)),
        straggler=find_straggler(timelines),
        samples={str(name): tuple((_score(s), str(i), str(p)) for s, i, p in items)
                 for name, items in obj.get("samples", {}).items()},
        rank_extremes={str(name): (_score(lo), _score(hi))
                       for name, (lo, hi) in obj.get("rank_extremes", {}).items()},
    )


class WatermarkStore:
    """SQLite file (or ``:memory:``) holding finalized-step watermarks and the record outbox."""

    def __init__(self, path: str | Path = ":memory:") -> None:
        self._db = open_database(path, _SCHEMA)
        self._lock = threading.Lock()
        with self._lock:
            self._db.execute("BEGIN")
            self._db.execute("INSERT OR IGNORE INTO step_outbox SELECT run, role, 0, step, record "
                             "FROM record_outbox")
            self._db.execute("DELETE FROM record_outbox")
            self._db.execute("COMMIT")

    def load_streams(self, since: float | None = None
                     ) -> dict[tuple[str, str], tuple[int, float | None]]:
        """(attempt, unix time of the latest finalization) per (run, role); with ``since``,
        only of streams that finalized a step at or after it."""
        query = "SELECT run, role, attempt, last_finalized FROM streams"
        args: tuple[float, ...] = ()
        if since is not None:
            query += " WHERE last_finalized >= ?"
            args = (since,)
        with self._lock:
            rows = self._db.execute(query, args).fetchall()
        return {(run, role): (int(attempt), last) for run, role, attempt, last in rows}

    def begin_attempt(self, run: str, role: str, attempt: int) -> None:
        """A rerun of (run, role): forget its finalized steps, remember the attempt number."""
        with self._lock:
            self._db.execute("BEGIN")
            self._db.execute("DELETE FROM watermark WHERE run = ? AND role = ?", (run, role))
            self._db.execute("INSERT OR REPLACE INTO streams VALUES (?, ?, ?, NULL)",
                             (run, role, attempt))
            self._db.execute("COMMIT")

    def load(self, since: float | None = None) -> dict[tuple[str, str], FinalizedSteps]:
        """Finalized steps per (run, role); with ``since``, only of streams that finalized a
        step at or after that unix time (the others are read back when they report again)."""
        query = "SELECT w.run, w.role, w.floor, w.steps FROM watermark w"
        args: tuple[float, ...] = ()
        if since is not None:
            query += (" JOIN streams s ON s.run = w.run AND s.role = w.role"
                      " WHERE s.last_finalized >= ?")
            args = (since,)
        with self._lock:
            rows = self._db.execute(query, args).fetchall()
        return {(run, role): FinalizedSteps.restore(floor, json.loads(steps))
                for run, role, floor, steps in rows}

    def load_stream(self, run: str, role: str) -> tuple[FinalizedSteps | None, int, float | None]:
        """One stream's finalized steps, attempt and latest finalization (unix), if stored."""
        with self._lock:
            mark = self._db.execute("SELECT floor, steps FROM watermark WHERE run = ? AND role = ?",
                                    (run, role)).fetchone()
            info = self._db.execute(
                "SELECT attempt, last_finalized FROM streams WHERE run = ? AND role = ?",
                (run, role)).fetchone()
        done = FinalizedSteps.restore(mark[0], json.loads(mark[1])) if mark else None
        return done, int(info[0]) if info else 0, info[1] if info else None

    def prune(self, before: float) -> int:
        """Forget streams whose latest finalization is older than ``before`` (unix) and that
        have nothing left to deliver; returns how many (the retention of the watermark)."""
        with self._lock:
            self._db.execute("BEGIN")
            try:
                old = self._db.execute(
                    "SELECT run, role FROM streams s WHERE last_finalized < ? AND NOT EXISTS ("
                    "SELECT 1 FROM step_outbox o WHERE o.run = s.run AND o.role = s.role)",
                    (before,)).fetchall()
                self._db.executemany("DELETE FROM watermark WHERE run = ? AND role = ?", old)
                self._db.executemany("DELETE FROM streams WHERE run = ? AND role = ?", old)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return len(old)

    def commit(
        self, finalized: dict[tuple[str, str], FinalizedSteps], records: Iterable[StepRecord],
        now: float | None = None,
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
                    "INSERT OR REPLACE INTO streams VALUES (?, ?, ?, ?)",
                    [(r.run, r.role, r.attempt, now) for r in {(r.run, r.role): r
                                                                 for r in records}.values()],
                )
                self._db.executemany(
                    "INSERT OR REPLACE INTO step_outbox VALUES (?, ?, ?, ?, ?)",
                    [(r.run, r.role, r.attempt, r.step, encode_record(r)) for r in records],
                )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def save_liveness(self, streams: dict[tuple[str, str], dict[str, Any]],
                      gone: Iterable[tuple[str, str]] = ()) -> None:
        """Each stream's liveness knowledge (who was heard when, step periods, states, the
        deadline's view of its ranks), so a restart neither forgets a stall nor relearns who is
        dead (:mod:`rlmon.service.liveness.run_state`); ``gone`` streams are dropped."""
        with self._lock:
            self._db.execute("BEGIN")
            try:
                self._db.executemany("DELETE FROM liveness WHERE run = ? AND role = ?", list(gone))
                self._db.executemany(
                    "INSERT OR REPLACE INTO liveness VALUES (?, ?, ?)",
                    [(run, role, json.dumps(data, allow_nan=False, separators=(",", ":")))
                     for (run, role), data in streams.items()])
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def load_liveness(self) -> dict[tuple[str, str], dict[str, Any]]:
        """What :meth:`save_liveness` kept; an unreadable row is skipped (relearned)."""
        with self._lock:
            rows = self._db.execute("SELECT run, role, data FROM liveness").fetchall()
        out: dict[tuple[str, str], dict[str, Any]] = {}
        for run, role, text in rows:
            try:
                data = json.loads(text)
            except ValueError:
                continue
            if isinstance(data, dict):
                out[(run, role)] = data
        return out

    def undelivered(self, limit: int = 1000) -> list[StepRecord]:
        with self._lock:
            rows = self._db.execute(
                "SELECT record FROM step_outbox ORDER BY run, role, attempt, step LIMIT ?",
                (limit,)
            ).fetchall()
        out: list[StepRecord] = []
        for (text,) in rows:
            try:
                out.append(decode_record(text))
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                log.warning("skipping an unreadable outbox record: %s", exc)
        return out

    def delivered(self, records: Iterable[StepRecord]) -> None:
        with self._lock:
            self._db.executemany(
                "DELETE FROM step_outbox WHERE run = ? AND role = ? AND attempt = ? AND step = ?",
                [(r.run, r.role, r.attempt, r.step) for r in records],
            )

    def close(self) -> None:
        with self._lock:
            self._db.close()
