"""rlmon's own files: partial-report JSON Lines (the contract, docs/contract.md) and the history
store (SQLite). Their names are canonical already and their steps aggregated by rlmon itself:
partial reports go through the contract parser and the step assembler, as ``rlmon replay`` does;
the store's step lines are read back as they were finalized. The store is opened read-only, so
diagnosing a live service's file changes nothing in it.
"""

from __future__ import annotations

import sqlite3
from collections import defaultdict
from pathlib import Path
from typing import Any

from rlmon.service.contract.step_record import StepRecord
from rlmon.service.diagnose.logged_run import LogError, LoggedRun, ReadProblem
from rlmon.service.json_input import loads as bounded_json
from rlmon.service.metrics.nonfinite import NONFINITE_VALUES
from rlmon.service.metrics.rank import Rank
from rlmon.service.replay import replay
from rlmon.service.storage.history import check_history_schema
from rlmon.service.storage.sqlite_db import StoreSchemaError

__all__ = ["SQLITE_MAGIC", "is_partial_report", "read_history_store", "read_partial_reports"]

SQLITE_MAGIC = b"SQLite format 3\x00"


def is_partial_report(obj: dict[str, Any]) -> bool:
    return {"run", "role", "step", "metrics"} <= set(obj)


def _by_run(path: Path, fmt: str, records: list[StepRecord],
            problems: tuple[ReadProblem, ...]) -> list[LoggedRun]:
    runs: dict[str, list[StepRecord]] = defaultdict(list)
    for record in records:
        runs[record.run].append(record)
    if not runs:
        raise LogError(str(path), "no step could be read"
                       + (f" ({problems[0].message})" if problems else ""))
    return [LoggedRun(str(path), fmt, name, records=tuple(found),
                      problems=problems if i == 0 else ())
            for i, (name, found) in enumerate(runs.items())]


def read_partial_reports(path: Path) -> list[LoggedRun]:
    try:
        with path.open("rb") as handle:
            result = replay(handle, rules=[])
    except OSError as exc:
        raise LogError(str(path), f"cannot read: {exc.strerror or exc}") from None
    problems = tuple(ReadProblem(f"{path}:{e.line}", e.error) for e in result.errors)
    return _by_run(path, "rlmon-partial-reports", [record for record, _ in result.steps],
                   problems)


def _record(line: dict[str, Any]) -> StepRecord:
    metrics = {k: float(v) for k, v in line["metrics"].items() if v is not None}
    metrics.update({k: NONFINITE_VALUES[v] for k, v in line.get("nonfinite", {}).items()})
    return StepRecord(
        run=line["run"], role=line["role"], step=int(line["step"]),
        complete=bool(line["complete"]), ranks_expected=int(line["ranks_expected"]),
        ranks_reporting=int(line["ranks_reporting"]),
        missing_ranks=tuple(Rank(**r) for r in line.get("missing_ranks", ())),
        metrics=metrics, replica_mismatches=tuple(line.get("replica_mismatches", ())),
        attempt=int(line.get("attempt", 0)),
    )


def read_history_store(path: Path) -> list[LoggedRun]:
    try:
        db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise LogError(str(path), f"cannot open as SQLite: {exc}") from None
    try:
        check_history_schema(db, str(path))  # a view or trigger of its own: refused
        rows = db.execute("SELECT line FROM steps ORDER BY run, role, attempt, step").fetchall()
    except StoreSchemaError as exc:
        raise LogError(str(path), str(exc).removeprefix(f"{path}: ")) from None
    except sqlite3.Error as exc:
        raise LogError(str(path), "expected an rlmon history store (a SQLite file with a "
                       f"'steps' table): {exc}") from None
    finally:
        db.close()
    problems = []
    records = []
    for index, (text,) in enumerate(rows, start=1):
        try:
            records.append(_record(bounded_json(text)))
        except (ValueError, KeyError, TypeError) as exc:
            problems.append(ReadProblem(f"{path}: steps row {index}",
                                        f"not a step line: {exc!r}"))
    return _by_run(path, "rlmon-history", records, tuple(problems))


