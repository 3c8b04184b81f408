"""History out: `rlmon export` (Parquet, CSV) and rlmon.history (DataFrame, Arrow) give back the
history store's values exactly: every (role, attempt, step), NaN and infinities as such, a
metric a step did not report as null."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import pytest

import rlmon.history
from rlmon.cli import main
from rlmon.service.storage.history import HistoryStore
from rlmon.service.storage.step_files import arrow_batches
from rlmon.service.storage.step_table import META_COLUMNS, StepTable
from tests.support.records import step_record
from tests.support.web_support import example_records

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pd = pytest.importorskip("pandas")

RUN = "grpo-demo-0"


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store with the example run, plus odd steps: NaN, +-Inf, a metric reported only
    sometimes, an incomplete step, a rerun (attempt 1), and a second run."""
    state = tmp_path_factory.mktemp("state")
    store = HistoryStore(state / "history.sqlite")
    odd = [
        step_record(run=RUN, role="critic", step=0, metrics={
            "critic/loss": math.nan, "critic/value": math.inf, "critic/grad_norm": 0.1 + 0.2},
            finalized_at=1_700_000_100.25),
        step_record(run=RUN, role="critic", step=1, metrics={"critic/value": -math.inf},
                    complete=False, ranks_expected=4, ranks_reporting=3),
        step_record(run=RUN, role="critic", step=0, attempt=1, metrics={"critic/loss": 1e-300},
                    finalized_at=1_700_000_200.5),
        step_record(run="other", role="actor", step=5, metrics={"actor/kl": 2.0}),
    ]
    store.add([*example_records(), *odd])
    store.close()
    return state


def _expected(state: Path, run: str = RUN) -> dict[tuple[str, int, int], dict[str, Any]]:
    """(role, attempt, step) -> the stored step: its metrics (non-finite ones restored), time
    and completeness, from the store's own step lines and rows."""
    store = HistoryStore(state / "history.sqlite")
    try:
        rows = store.read("SELECT role, attempt, step, finalized_at, complete, ranks_expected, "
                          "ranks_reporting FROM steps WHERE run = ?", (run,))
        lines = store.steps(run)
    finally:
        store.close()
    names = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
    out: dict[tuple[str, int, int], dict[str, Any]] = {}
    for role, attempt, step, at, complete, expected, reporting in rows:
        out[(role, attempt, step)] = {"time": at, "complete": bool(complete),
                                      "ranks_expected": expected,
                                      "ranks_reporting": reporting, "metrics": {}}
    for line in lines:
        metrics = {k: float(v) for k, v in line["metrics"].items() if v is not None}
        metrics.update({k: names[v] for k, v in line.get("nonfinite", {}).items()})
        out[(line["role"], line.get("attempt", 0), line["step"])]["metrics"] = metrics
    return out


def _same(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return (math.isnan(a) and math.isnan(b)) or a == b


def _check(rows: list[dict[str, Any]], expected: dict[tuple[str, int, int], dict[str, Any]],
           metrics: list[str]) -> None:
    assert [(r["role"], r["attempt"], r["step"]) for r in rows] == sorted(expected)
    for row in rows:
        want = expected[(row["role"], row["attempt"], row["step"])]
        assert row["run"] == RUN
        assert _same(row["time"], want["time"])
        for key in ("complete", "ranks_expected", "ranks_reporting"):
            assert row[key] == want[key], key
        for name in metrics:
            assert _same(row[name], want["metrics"].get(name)), (row["step"], name)
        assert set(want["metrics"]) <= set(metrics)


def test_the_table_pages_through_every_step_with_exact_values(state: Path) -> None:
    table = StepTable(state / "history.sqlite", RUN, page_steps=7)
    expected = _expected(state)
    batches = list(arrow_batches(table))
    assert max(b.num_rows for b in batches) == 7 and len(batches) > 10
    rows = pa.Table.from_batches(batches).to_pylist()
    _check(rows, expected, list(table.metrics()))
    assert table.columns[:len(META_COLUMNS)] == META_COLUMNS
    assert "critic/loss" in table.metrics() and "actor/kl" in table.metrics()


def test_export_parquet_round_trips_the_store_exactly(state: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run.parquet"
    assert main(["export", RUN, "--state-dir", str(state), "--format", "parquet",
                 "-o", str(out)]) == 0
    table = pq.read_table(out)
    _check(table.to_pylist(), _expected(state), table.column_names[len(META_COLUMNS):])
    said = capsys.readouterr().err
    assert f"{table.num_rows} rows (a row per role and step) x " \
        f"{len(table.column_names) - len(META_COLUMNS)} metrics of run {RUN}" in said
    # NaN and null stay apart: the critic's step 0 reported NaN, step 1 did not report
    loss = {(r["attempt"], r["step"]): r["critic/loss"] for r in table.to_pylist()
            if r["role"] == "critic"}
    assert math.isnan(loss[(0, 0)]) and loss[(0, 1)] is None and loss[(1, 0)] == 1e-300


def test_export_csv_round_trips_the_store_exactly(state: Path, tmp_path: Path) -> None:
    out = tmp_path / "critic.csv"
    assert main(["export", RUN, "--role", "critic", "--state-dir", str(state), "-o",
                 str(out)]) == 0
    with out.open(newline="") as handle:
        raw = list(csv.DictReader(handle))
    metrics = [c for c in raw[0] if c not in META_COLUMNS]
    rows = []
    for r in raw:
        row: dict[str, Any] = {k: (float(v) if v else None) for k, v in r.items()
                               if k in (*metrics, "time")}
        row.update(run=r["run"], role=r["role"], attempt=int(r["attempt"]),
                   step=int(r["step"]), complete=r["complete"] == "true",
                   ranks_expected=int(r["ranks_expected"]),
                   ranks_reporting=int(r["ranks_reporting"]))
        rows.append(row)
    expected = {k: v for k, v in _expected(state).items() if k[0] == "critic"}
    _check(rows, expected, metrics)


def test_export_errors_name_the_run_role_or_format(state: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", "nope", "--state-dir", str(state), "-o",
                 str(tmp_path / "x.csv")]) == 1
    assert "no run 'nope'" in capsys.readouterr().err
    assert main(["export", RUN, "--role", "judge", "--state-dir", str(state), "-o",
                 str(tmp_path / "x.csv")]) == 1
    assert "no role 'judge'" in capsys.readouterr().err
    assert main(["export", RUN, "--state-dir", str(state), "-o", str(tmp_path / "x.txt")]) == 2
    assert "--format" in capsys.readouterr().err
    assert main(["export", RUN, "--state-dir", str(tmp_path / "empty"), "-o",
                 str(tmp_path / "x.csv")]) == 2
    assert "no history store" in capsys.readouterr().err


def test_history_api_lists_runs_and_returns_dataframes_and_arrow_tables(state: Path) -> None:
    runs = rlmon.history.runs(state)
    assert {r["run"] for r in runs} == {RUN, "other"}
    demo = next(r for r in runs if r["run"] == RUN)
    expected = _expected(state)
    assert demo["roles"] == ["actor", "critic", "reward", "rollout"]
    assert (demo["steps"], demo["attempts"]) == (len(expected), 2)
    table = rlmon.history.arrow(RUN, state_dir=state)
    _check(table.to_pylist(), expected, table.column_names[len(META_COLUMNS):])
    frame = rlmon.history.steps(RUN, "actor", state_dir=state)
    actor = {k: v for k, v in expected.items() if k[0] == "actor"}
    assert len(frame) == len(actor)
    for row in frame.to_dict("records"):
        want = actor[(row["role"], row["attempt"], row["step"])]["metrics"]
        for name, value in want.items():
            assert _same(float(row[name]), value)
    arrow_backed = rlmon.history.steps(RUN, "critic", state_dir=state, dtype_backend="pyarrow")
    assert arrow_backed["critic/loss"].isna().tolist() == [False, True, False]  # NaN is a value
    with pytest.raises(KeyError, match="no steps of run 'nope'"):
        rlmon.history.steps("nope", state_dir=state)
