"""An alert on a NaN or infinite value says which, wherever it is read back from the history
store: SQLite keeps a NaN as NULL, so the store keeps the value's name beside it, and the report
(text, HTML, JSON), ``rlmon alerts`` and the page's alert API say "NaN" / "+Inf" as diagnose and
the notifications do, never "n/a" (which reads as no value at all)."""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path

import pytest

from rlmon.cli import main
from rlmon.service.alerting.alert_types import AlertEvent
from rlmon.service.config import GoodputConfig
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.diagnose.findings import Finding
from rlmon.service.metrics.nonfinite import nonfinite_name, nonfinite_value
from rlmon.service.report.html import render_html
from rlmon.service.report.model import build_report
from rlmon.service.report.text import render_text
from rlmon.service.storage.history import HistoryStore
from rlmon.service.web.api import WebApi
from rlmon.service.wording import format_value

RUN = "grpo-nan"


def _event(step: int, state: str, value: float | None) -> AlertEvent:
    return AlertEvent(run=RUN, role="actor", step=step, alert="NonFiniteMetric",
                      severity="critical", state=state, metric="actor/grad_norm", value=value)


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    store = HistoryStore(tmp_path / "history.sqlite")
    try:
        for step in range(4):
            store.add([StepRecord(RUN, "actor", step, True, 1, 1, (),
                                  {"actor/grad_norm": math.nan if step == 2 else 0.5})],
                      [_event(2, "firing", math.nan)] if step == 2 else
                      [_event(3, "resolved", 0.5)] if step == 3 else [])
    finally:
        store.close()
    return tmp_path


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 0.25, None])
def test_a_value_and_its_name_make_the_same_value_again(value: float | None) -> None:
    name = nonfinite_name(value)  # '' for a finite value or none
    assert (name == "") == (value is None or math.isfinite(value))
    stored = None if name else value
    back = nonfinite_value(stored, name)
    assert (back is None and value is None) or back == value or (
        back is not None and value is not None and math.isnan(back) and math.isnan(value))
    assert format_value(back) == {"NaN": "NaN", "Infinity": "+Inf", "-Infinity": "-Inf",
                                  "": format_value(value)}[name]


def test_the_store_keeps_which_non_finite_value_fired(state_dir: Path) -> None:
    store = HistoryStore(state_dir / "history.sqlite", read_only=True)
    try:
        fired, resolved = store.alerts(RUN, cost=True)
        recent = store.recent_alerts(RUN)
    finally:
        store.close()
    assert (fired["value"], fired["nonfinite"]) == (None, "NaN")
    assert (resolved["value"], resolved["nonfinite"]) == (0.5, "")
    assert [(a["state"], a["nonfinite"]) for a in recent] == [("resolved", ""), ("firing", "NaN")]
    plain = HistoryStore(state_dir / "history.sqlite", read_only=True)
    try:  # the replay contract's own alert lines are unchanged: a null value, no new key
        assert "nonfinite" not in plain.alerts(RUN)[0]
    finally:
        plain.close()


def test_the_report_and_rlmon_alerts_say_nan(state_dir: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    store = HistoryStore(state_dir / "history.sqlite", read_only=True)
    try:
        report = build_report(store, RUN, GoodputConfig(), now=0.0)
    finally:
        store.close()
    (alert,) = report.alerts
    assert alert.value is not None and math.isnan(alert.value)
    assert "(actor/grad_norm = NaN)" in render_text(report)
    assert '<td class="n">NaN</td>' in render_html(report)
    data = report.to_json()
    assert (data["alerts"][0]["value"], data["alerts"][0]["nonfinite"]) == (None, "NaN")
    json.dumps(data, allow_nan=False)  # still JSON
    assert main(["alerts", "--run", RUN, "--state-dir", str(state_dir)]) == 0
    table = capsys.readouterr().out
    firing_row = next(line for line in table.splitlines() if "NonFiniteMetric" in line
                      and "firing" in line)
    assert "NaN" in firing_row and "n/a" not in firing_row


def test_the_pages_alert_api_says_which_non_finite_value(state_dir: Path) -> None:
    store = HistoryStore(state_dir / "history.sqlite", read_only=True)
    try:
        found = WebApi(store).alert({"run": RUN, "role": "actor", "alert": "NonFiniteMetric"})
    finally:
        store.close()
    assert (found["value"], found["nonfinite"]) == (None, "NaN")
    json.dumps(found, allow_nan=False)


def test_an_older_store_without_the_column_reads_as_before(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    HistoryStore(path).close()
    db = sqlite3.connect(path)
    db.execute("ALTER TABLE alerts DROP COLUMN nonfinite")
    db.commit()
    db.close()
    old = HistoryStore(path, read_only=True)  # read-only: not migrated
    try:
        assert old.recent_alerts() == [] and not old.has_column("alerts", "nonfinite")
    finally:
        old.close()
    migrated = HistoryStore(path)
    try:
        assert migrated.has_column("alerts", "nonfinite")
    finally:
        migrated.close()


@pytest.mark.parametrize(("value", "name", "shown"), [
    (math.nan, "NaN", "NaN"), (math.inf, "Infinity", "+Inf"), (-math.inf, "-Infinity", "-Inf")])
def test_diagnose_json_names_a_non_finite_value_as_the_contract_does(
        value: float, name: str, shown: str) -> None:
    """``diagnose --json``'s ``nonfinite`` is the contract's name, as in every other JSON output;
    the text says it as the notifications do."""
    finding = Finding(RUN, "actor", 2, "NonFiniteMetric", "critical", "firing",
                      "actor/grad_norm", "grad_norm", value)
    data = finding.to_json()
    assert (data["value"], data["nonfinite"]) == (None, name)
    assert format_value(value) == shown
