"""The store's own schema is not input (issue 40, E10): a state directory is a local user's to
craft, so a column name, a trigger or a view in one of its SQLite files must never run as SQL.
Migrations quote identifiers and check them against the code's schema; a file holding a trigger
or a view, or one of rlmon's names as another kind of object, is refused with an error naming
it, and nothing in it has run. Checked through ``rlmon report`` and ``rlmon diagnose`` too."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from rlmon.cli import main
from rlmon.service.aggregation.watermark import WatermarkStore
from rlmon.service.alerting.notify.outbox import Outbox
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.diagnose.formats import read_paths
from rlmon.service.storage.history import HistoryStore
from rlmon.service.storage.sqlite_db import StoreSchemaError

# an old store's steps table (before attempts) whose last column's name closes the migration's
# column list and selects a row of its own: pasted into SQL, it replaces the stored steps
INJECTED = "line) SELECT 'injected', 'actor', 0, 1, 1, 1, 0.0, '{}' --"
OLD_STEPS = ("CREATE TABLE steps (run TEXT NOT NULL, role TEXT NOT NULL, step INTEGER NOT NULL, "
             "complete INTEGER NOT NULL, ranks_expected INTEGER NOT NULL, ranks_reporting "
             "INTEGER NOT NULL, finalized_at REAL, \"{}\" TEXT, PRIMARY KEY (run, role, step))")
LINE = {"type": "step", "run": "grpo-7b", "role": "actor", "step": 1, "complete": True,
        "ranks_expected": 1, "ranks_reporting": 1, "missing_ranks": [], "metrics": {"actor/kl": 0.1}}


def _crafted_old_store(path: Path) -> None:
    db = sqlite3.connect(path)
    db.execute(OLD_STEPS.format(INJECTED.replace('"', '""')))
    db.execute("INSERT INTO steps VALUES ('grpo-7b', 'actor', 1, 1, 1, 1, 0.0, ?)",
               (json.dumps(LINE),))
    db.commit()
    db.close()


def _tables(path: Path) -> dict[str, list[tuple[object, ...]]]:
    db = sqlite3.connect(path)
    try:
        names = [n for (n,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {n: db.execute(f'SELECT * FROM "{n}"').fetchall() for n in names}
    finally:
        db.close()


def test_a_crafted_column_name_is_refused_not_run(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    _crafted_old_store(path)
    with pytest.raises(StoreSchemaError) as info:
        HistoryStore(path)
    assert f"{path}: table steps has a column" in str(info.value)
    assert "never writes" in str(info.value)
    tables = _tables(path)
    assert "steps_old" not in tables  # the migration never began
    assert [row[0] for row in tables["steps"]] == ["grpo-7b"]  # and no row of its own went in


def test_rlmon_report_refuses_a_crafted_state_directory(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _crafted_old_store(tmp_path / "history.sqlite")
    for command in ("report", "diff"):
        args = [command, "grpo-7b"] + (["injected"] if command == "diff" else [])
        assert main([*args, "--state-dir", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert f"rlmon {command}: {tmp_path / 'history.sqlite'}: table steps has a column" in err
    assert [row[0] for row in _tables(tmp_path / "history.sqlite")["steps"]] == ["grpo-7b"]


def test_an_old_store_rlmon_wrote_is_still_migrated(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    db = sqlite3.connect(path)
    db.execute(OLD_STEPS.format("line"))
    db.execute("INSERT INTO steps VALUES ('grpo-7b', 'actor', 1, 1, 1, 1, 0.0, ?)",
               (json.dumps(LINE),))
    db.commit()
    db.close()
    store = HistoryStore(path)
    try:
        assert store.runs() == ["grpo-7b"]
        assert [line["step"] for line in store.steps("grpo-7b")] == [1]
    finally:
        store.close()


def _with_trigger(path: Path, table: str) -> None:
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE pwned (at INTEGER)")
    db.execute(f"CREATE TRIGGER t_{table} AFTER INSERT ON {table} BEGIN "
               "INSERT INTO pwned VALUES (1); END")
    db.commit()
    db.close()


def test_a_trigger_in_any_store_file_is_refused_before_it_can_fire(tmp_path: Path) -> None:
    history = tmp_path / "history.sqlite"
    store = HistoryStore(history)
    store.add([StepRecord("grpo-7b", "actor", 1, True, 1, 1, (), {"actor/kl": 0.1})])
    store.close()
    db = sqlite3.connect(history)
    db.execute("DELETE FROM curve_rows")  # opening packs them again: an insert the trigger sees
    db.commit()
    db.close()
    _with_trigger(history, "curve_rows")
    with pytest.raises(StoreSchemaError, match=r"holds a trigger 't_curve_rows'"):
        HistoryStore(history)
    with pytest.raises(StoreSchemaError, match=r"holds a trigger"):
        HistoryStore(history, read_only=True)  # the page's reader
    assert _tables(history)["pwned"] == []
    outbox = tmp_path / "outbox.sqlite"
    Outbox(outbox).close()
    _with_trigger(outbox, "outbox")
    with pytest.raises(StoreSchemaError, match=r"holds a trigger 't_outbox'"):
        Outbox(outbox)
    marks = tmp_path / "watermarks.sqlite"
    WatermarkStore(marks).close()
    _with_trigger(marks, "watermark")
    with pytest.raises(StoreSchemaError, match=r"holds a trigger"):
        WatermarkStore(marks)


def test_a_view_under_a_table_name_is_refused_by_the_store_and_by_diagnose(
        tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE VIEW steps AS SELECT ? AS line, 'grpo-7b' AS run, 'actor' AS role, "
               "0 AS attempt, 1 AS step".replace("?", "'" + json.dumps(LINE) + "'"))
    db.commit()
    db.close()
    with pytest.raises(StoreSchemaError, match=r"holds a view 'steps'"):
        HistoryStore(path)
    runs, problems = read_paths([str(path)])
    assert runs == [] and len(problems) == 1
    assert "holds a view 'steps'" in problems[0].message
