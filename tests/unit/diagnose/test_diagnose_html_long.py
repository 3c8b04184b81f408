"""``diagnose --html`` of a long log (issue 40, E17: a million entries held 3.5 KB a step in an
in-memory store): the report's role summary and curves come straight from the log's columns,
the curves thinned to a bounded number of points that keep every bucket's lowest and highest
value, and equal to what the report builds from step lines. Its time and memory against the
text output are measured by bench/bench_diagnose_html.py, not here."""

from __future__ import annotations

import json
from pathlib import Path

from rlmon.cli import main
from rlmon.service.diagnose.findings import diagnose
from rlmon.service.diagnose.formats import read_paths
from rlmon.service.diagnose.html import log_story, run_report
from rlmon.service.report.model import MAX_CURVE_POINTS, build_report
from rlmon.service.storage.history import HistoryStore

STEPS = 9_001


def _long_state(path: Path) -> Path:
    rows = [{"step": s, "loss": 0.01 * (s % 7), "entropy": 2.0 - s / STEPS,
             "reward": 99.0 if s == 4_321 else (-5.0 if s == 777 else 0.3 + 0.001 * (s % 13)),
             "kl": 0.01, "grad_norm": 1.0, "learning_rate": 1e-5,
             "reward_std": float("nan") if s == 50 else 0.4, "epoch": s / STEPS}
            for s in range(1, STEPS + 1)]
    path.mkdir(parents=True)
    (path / "trainer_state.json").write_text(json.dumps({"global_step": STEPS,
                                                         "log_history": rows}))
    return path


def test_the_long_report_is_built_from_the_columns_as_from_a_store(tmp_path: Path) -> None:
    """The same role summary and curves as the report of a history store holding the steps
    (what ``diagnose --html`` did before, at 3.5 KB a step)."""
    (run,), _ = read_paths([_long_state(tmp_path / "run")])
    d = diagnose(run)
    report = run_report(d)
    store = HistoryStore(":memory:")
    store.add([record for record, _ in d.steps], [e for _, events in d.steps for e in events])
    stored = log_story(build_report(store, d.run.name), d)  # a log's story, as diagnose's
    store.close()
    assert report.roles == stored.roles
    assert report.curves == stored.curves
    assert report.alerts == stored.alerts
    assert report.curves
    for curve in report.curves:
        assert len(curve.points) <= 2 * MAX_CURVE_POINTS + 2
        steps = [s for s, _ in curve.points]
        assert steps == sorted(steps) and steps[0] == 1  # in step order, from the first
    reward = next(c for c in report.curves if c.metric == "rollout/reward")
    assert (4_321, 99.0) in reward.points and (777, -5.0) in reward.points  # spikes kept


def test_diagnose_html_of_a_long_log_writes_its_page(tmp_path: Path) -> None:
    log = _long_state(tmp_path / "run")
    page = tmp_path / "out.html"
    assert main(["diagnose", str(log), "--html", str(page)]) in (0, 2)
    text = page.read_text()
    assert f"{STEPS} steps" in text and text.count("data:image/png;base64,") >= 3
