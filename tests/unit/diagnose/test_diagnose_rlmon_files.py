"""rlmon's own files: the bundled example run's partial reports (the demo workload's output) and
a history store written by HistoryStore. Diagnose must say what replay says, step for step."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from rlmon.service.diagnose.findings import diagnose
from rlmon.service.diagnose.formats import read_paths
from rlmon.service.replay import replay
from rlmon.service.storage.history import HistoryStore
from tests.support.paths import REPO

EXAMPLE = REPO / "rlmon" / "data" / "example_run.jsonl"


def _replayed() -> list[tuple[int, str, str]]:
    with EXAMPLE.open("rb") as handle:
        result = replay(handle)
    return [(e.step, e.alert, e.state) for e in result.alerts]


def _transitions(path: Path) -> list[tuple[int, str, str]]:
    (run,), problems = read_paths([path])
    assert problems == []
    return [(f.step, f.alert, f.state) for f in diagnose(run).findings if f.source == "rules"]


def test_partial_reports_give_what_replay_gives() -> None:
    expected = _replayed()
    assert expected  # the example run has its fault
    assert sorted(_transitions(EXAMPLE)) == sorted(expected)


def test_a_history_store_gives_what_replay_gives(tmp_path: Path) -> None:
    with EXAMPLE.open("rb") as handle:
        result = replay(handle)
    db = tmp_path / "history.db"
    store = HistoryStore(db)
    store.add([record for record, _ in result.steps], result.alerts)
    store.close()
    before = db.stat().st_mtime_ns
    assert sorted(_transitions(db)) == sorted(_replayed())
    assert db.stat().st_mtime_ns == before  # opened read-only


def test_a_bad_partial_line_is_named_and_the_rest_diagnosed(tmp_path: Path) -> None:
    lines = EXAMPLE.read_text().splitlines()
    broken = tmp_path / "run.jsonl"
    broken.write_text("\n".join([lines[0], '{"run": "x", "role": "actor", "step": -1, '
                                 '"metrics": {}}', *lines[1:]]) + "\n")
    (run,), problems = read_paths([broken])
    assert problems == []  # the file was read; its bad line is the run's problem
    (problem,) = run.problems
    assert problem.path == f"{broken}:2" and "step" in problem.message
    assert diagnose(run).findings


def test_a_sqlite_file_that_is_no_history_store_is_named(tmp_path: Path) -> None:
    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.commit()
    runs, problems = read_paths([other])
    assert runs == []
    (problem,) = problems
    assert problem.path == str(other) and "history store" in problem.message
