"""A run's stored steps as a table, streamed: one row per (role, attempt, step), one column per
metric, beside the step's time and completeness.

The history store keeps each step as its replay line (JSON); this reads them a page at a time
(keyset pages over the steps' primary key, through a read-only connection of its own), so a
million-step run goes out in memory bounded by the page, never by the run. The columns are known
before the first row (one pass of SQLite's ``json_each`` over the run's metric names), which a
Parquet schema or a CSV header needs. Values are the stored float64s exactly: a NaN or an
infinity stays one, and a metric the step did not report is a null (``None``), not a NaN.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlmon.service.metrics.nonfinite import NONFINITE_VALUES
from rlmon.service.storage.history import HistoryStore

__all__ = ["META_COLUMNS", "StepPage", "StepTable", "stored_runs"]

#: the columns before the metrics: what identifies the step, when it was finalized (unix
#: seconds), and whether every rank reported it
META_COLUMNS: tuple[str, ...] = ("run", "role", "attempt", "step", "time", "complete",
                                 "ranks_expected", "ranks_reporting")
PAGE_STEPS = 10_000  # steps per page (what one page holds in memory)


@dataclass(frozen=True, slots=True)
class StepPage:
    """Up to ``PAGE_STEPS`` rows, by column: ``meta[name]`` for :data:`META_COLUMNS`,
    ``metrics[name]`` for each metric (None where the step did not report it)."""

    meta: dict[str, list[Any]]
    metrics: dict[str, list[float | None]]

    def __len__(self) -> int:
        return len(self.meta["step"])


def stored_runs(path: str | Path) -> list[dict[str, Any]]:
    """Every run the store holds, the latest to finalize a step first: its roles, attempts,
    steps stored, first and last step and the times of its first and last step."""
    store = HistoryStore(path, read_only=True)
    try:
        rows = store.read(
            "SELECT run, group_concat(DISTINCT role), MAX(attempt), COUNT(*), MIN(step), "
            "MAX(step), MIN(finalized_at), MAX(finalized_at) FROM steps GROUP BY run "
            "ORDER BY MAX(finalized_at) DESC")
    finally:
        store.close()
    keys = ("run", "roles", "attempts", "steps", "first_step", "last_step", "first_time",
            "last_time")
    out = []
    for row in rows:
        entry = dict(zip(keys, row, strict=True))
        entry["roles"] = sorted(str(entry["roles"]).split(","))
        entry["attempts"] = int(entry["attempts"]) + 1
        out.append(entry)
    return out


class StepTable:
    """The steps of ``run`` (of one ``role``, or every role) in a history store file."""

    def __init__(self, path: str | Path, run: str, role: str | None = None,
                 page_steps: int = PAGE_STEPS) -> None:
        if not Path(path).exists():
            raise FileNotFoundError(f"no history store at {path}")
        self.path, self.run, self.role, self.page_steps = Path(path), run, role, page_steps
        self._args: tuple[Any, ...] = (run, role) if role is not None else (run,)
        self._metrics: tuple[str, ...] | None = None

    def _store(self) -> HistoryStore:
        return HistoryStore(self.path, read_only=True)

    def steps(self) -> int:
        """How many rows the table has."""
        query = "SELECT COUNT(*) FROM steps WHERE run = ?"
        if self.role is not None:
            query += " AND role = ?"
        store = self._store()
        try:
            (n,), = store.read(query, self._args)
        finally:
            store.close()
        return int(n)

    def metrics(self) -> tuple[str, ...]:
        """The metric columns: every metric any of the steps reported (a non-finite value is in
        the line's ``nonfinite`` map), sorted."""
        if self._metrics is None:
            query = ("SELECT DISTINCT j.key FROM steps s, json_each(s.line, '$.metrics') j "
                     "WHERE s.run = ?")
            if self.role is not None:
                query += " AND s.role = ?"
            store = self._store()
            try:
                rows = store.read(query, self._args)
            finally:
                store.close()
            self._metrics = tuple(sorted(str(name) for (name,) in rows))
        return self._metrics

    @property
    def columns(self) -> tuple[str, ...]:
        return (*META_COLUMNS, *self.metrics())

    def pages(self) -> Iterator[StepPage]:
        """The rows in (role, attempt, step) order, a page at a time."""
        metrics = self.metrics()
        nonfinite = NONFINITE_VALUES
        after: tuple[str, int, int] = ("", -1, -1)
        query = ("SELECT role, attempt, step, finalized_at, complete, ranks_expected, "
                 "ranks_reporting, line FROM steps WHERE run = ?")
        if self.role is not None:
            query += " AND role = ?"
        query += " AND (role, attempt, step) > (?, ?, ?) ORDER BY role, attempt, step LIMIT ?"
        store = self._store()
        try:
            while True:
                rows = store.read(query, (*self._args, *after, self.page_steps))
                if not rows:
                    return
                meta: dict[str, list[Any]] = {name: [] for name in META_COLUMNS}
                values: dict[str, list[float | None]] = {name: [] for name in metrics}
                for role, attempt, step, at, complete, expected, reporting, line in rows:
                    for name, value in zip(META_COLUMNS, (
                            self.run, role, attempt, step, at, bool(complete), expected,
                            reporting), strict=True):
                        meta[name].append(value)
                    parsed = json.loads(line)
                    reported = parsed["metrics"]
                    odd = parsed.get("nonfinite", {})
                    for name in metrics:
                        value = reported.get(name)
                        if name in odd:
                            values[name].append(nonfinite[odd[name]])
                        else:
                            values[name].append(None if value is None else float(value))
                after = (rows[-1][0], int(rows[-1][1]), int(rows[-1][2]))
                yield StepPage(meta, values)
        finally:
            store.close()
