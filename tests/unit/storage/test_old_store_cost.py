"""A history store written before alerts carried their cost: the service's writer adds the
columns on open (rows written before stay cost-unknown), and the run page's read-only connection,
which cannot add them, reads it with the cost unknown and shown as such."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from rlmon.service.alerting.engine import AlertEvent, AlertState
from rlmon.service.config import Settings
from rlmon.service.report.model import build_report
from rlmon.service.report.text import render_text
from rlmon.service.service_core import ServiceCore
from rlmon.service.storage.history import HistoryStore
from tests.support.records import step_record

# The tables the store had before the cost columns (commit 9d9a1d1, rlmon/service/history.py).
_OLD_SCHEMA = """
CREATE TABLE IF NOT EXISTS steps (
    run TEXT NOT NULL, role TEXT NOT NULL, step INTEGER NOT NULL, complete INTEGER NOT NULL,
    ranks_expected INTEGER NOT NULL, ranks_reporting INTEGER NOT NULL, finalized_at REAL,
    line TEXT NOT NULL, attempt INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (run, role, attempt, step));
CREATE TABLE IF NOT EXISTS alerts (
    id INTEGER PRIMARY KEY AUTOINCREMENT, run TEXT NOT NULL, role TEXT NOT NULL,
    step INTEGER NOT NULL, alert TEXT NOT NULL, severity TEXT NOT NULL, state TEXT NOT NULL,
    metric TEXT NOT NULL, value REAL, attempt INTEGER NOT NULL DEFAULT 0,
    UNIQUE (run, role, attempt, step, alert, state));
CREATE TABLE IF NOT EXISTS alert_state (
    run TEXT NOT NULL, role TEXT NOT NULL, alert TEXT NOT NULL, true_steps INTEGER NOT NULL,
    false_steps INTEGER NOT NULL, firing INTEGER NOT NULL, since_step INTEGER,
    history TEXT NOT NULL, metric TEXT NOT NULL DEFAULT '', score REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (run, role, alert));
CREATE TABLE IF NOT EXISTS stream_state (
    run TEXT NOT NULL, role TEXT NOT NULL, last_step INTEGER NOT NULL, PRIMARY KEY (run, role));
CREATE TABLE IF NOT EXISTS outbound (
    id INTEGER PRIMARY KEY AUTOINCREMENT, finalized_at REAL, events TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS timelines (
    run TEXT NOT NULL, role TEXT NOT NULL, attempt INTEGER NOT NULL, step INTEGER NOT NULL,
    data TEXT NOT NULL, PRIMARY KEY (run, role, attempt, step));
CREATE TABLE IF NOT EXISTS samples (
    run TEXT NOT NULL, role TEXT NOT NULL, attempt INTEGER NOT NULL, step INTEGER NOT NULL,
    metric TEXT NOT NULL, data TEXT NOT NULL, PRIMARY KEY (run, role, attempt, step, metric));
CREATE TABLE IF NOT EXISTS stops (
    run TEXT NOT NULL PRIMARY KEY, decision TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS steps_run_time ON steps (run, finalized_at);
CREATE INDEX IF NOT EXISTS alerts_stream ON alerts (run, role, attempt, step);
"""
T0 = 1_700_000_000.0


def _old_store(path: Path) -> None:
    db = sqlite3.connect(path)
    db.executescript(_OLD_SCHEMA)
    for step in range(5):
        record = step_record(step=step, metrics={"actor/loss": 1.0}, finalized_at=T0 + step)
        db.execute("INSERT INTO steps VALUES (?, ?, ?, 1, 1, 1, ?, ?, 0)",
                   ("r", "actor", step, T0 + step, json.dumps(record.to_json())))
    db.executemany(
        "INSERT INTO alerts (run, role, step, alert, severity, state, metric, value) "
        "VALUES ('r', 'actor', ?, 'LossSpike', 'warning', ?, 'actor/loss', 1.0)",
        [(1, "firing"), (3, "resolved"), (4, "firing")])
    db.execute("INSERT INTO alert_state VALUES ('r', 'actor', 'LossSpike', 1, 0, 1, 4, '[]', "
               "'actor/loss', 0)")
    db.commit()
    db.close()


def _columns(path: Path, table: str) -> set[str]:
    db = sqlite3.connect(path)
    try:
        return {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
    finally:
        db.close()


def test_the_read_only_reader_shows_the_cost_unknown(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    _old_store(path)
    reader = HistoryStore(path, read_only=True)
    rows = reader.alerts("r", cost=True)
    assert [(r["step"], r["state"]) for r in rows] == [(1, "firing"), (3, "resolved"),
                                                       (4, "firing")]
    assert all(r[k] is None for r in rows for k in ("onset", "gpus", "gpu_hours", "money",
                                                    "cost_note"))
    (state,) = reader.alert_states("r").values()
    assert state.firing and state.onset is None and state.gpus == 0.0
    report = build_report(reader, "r")
    assert [(a.fired_step, a.resolved_step, a.gpu_hours) for a in report.alerts] == [
        (1, 3, None), (4, None, None)]
    text = render_text(report)
    assert text.count("cost unknown") == 2
    reader.close()
    assert "onset" not in _columns(path, "alerts")  # the reader changed nothing


def test_the_writer_adds_the_cost_columns_and_keeps_the_old_rows(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    _old_store(path)
    reader = HistoryStore(path, read_only=True)  # the run page, open across the migration
    service = ServiceCore(Settings.model_validate({"notifiers": {"console": {"enabled": False}}}),
                          state_dir=tmp_path)
    assert {"onset", "gpus", "gpu_hours", "money", "cost_note"} <= _columns(path, "alerts")
    assert {"onset", "gpus"} <= _columns(path, "alert_state")
    assert service.spine.judge.engine.states[("r", "actor", "LossSpike")].firing  # restored, no cost
    assert service.spine.judge.costs.firing(T0 + 10) == {}
    event = AlertEvent("r", "actor", 6, "LossSpike", "warning", "resolved", "actor/loss", 0.5,
                       onset=T0 + 4, gpus=8.0, gpu_hours=0.5, cost_note="lasted 4 s")
    service.history.add([], [event], states={
        ("r", "actor", "LossSpike"): AlertState(false_steps=1)})
    rows = reader.alerts("r", cost=True)
    assert [(r["step"], r["gpu_hours"], r["cost_note"] or "") for r in rows] == [
        (1, None, ""), (3, None, ""), (4, None, ""), (6, 0.5, "lasted 4 s")]
    service.close(0.0)
    reader.close()
