"""TensorBoard event files written by TensorBoard's own writer, read back and diagnosed: each
injected fault is found at its step, a healthy run gives no critical finding, and a damaged file
is reported while the events before the damage are still diagnosed."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlmon.service.diagnose.findings import diagnose
from rlmon.service.diagnose.formats import read_paths
from tests.support.diagnose_support import FAULT_ALERT, fired, trl_curves


def write_tensorboard(directory: Path, rows: dict[int, dict[str, float]]) -> Path:
    """As the Hugging Face callback logs them: ``train/<key>`` at the global step."""
    from tensorboard.summary import Writer

    writer = Writer(str(directory))
    for step, values in rows.items():
        for key, value in values.items():
            writer.add_scalar(f"train/{key}", value, step=step)
    writer.close()
    return directory


@pytest.mark.parametrize("fault", sorted(FAULT_ALERT))
def test_a_fault_is_found_at_its_step(tmp_path: Path, fault: str) -> None:
    write_tensorboard(tmp_path / "run", trl_curves(fault=fault, at=25))
    runs, problems = read_paths([tmp_path])
    assert problems == [] and len(runs) == 1
    run = runs[0]
    assert run.format == "tensorboard" and run.steps == 40
    d = diagnose(run)
    assert d.keymap.framework == "trl"
    alert, delay = FAULT_ALERT[fault]
    assert fired(d.findings)[alert] == 25 + delay
    finding = next(f for f in d.findings if f.alert == alert)
    assert finding.since == 25
    assert finding.key.startswith("train/")


def test_the_nan_finding_shows_the_gradient_norm_before_it(tmp_path: Path) -> None:
    write_tensorboard(tmp_path / "run", trl_curves(fault="nan", at=25))
    d = diagnose(read_paths([tmp_path])[0][0])
    nan = next(f for f in d.findings if f.alert == "NonFiniteMetric" and f.state == "firing")
    grad = next(r for r in nan.related if r.metric == "actor/grad_norm")
    assert [s for s, _ in grad.values] == [22, 23, 24, 25]
    assert grad.values[2][1] == pytest.approx(1000.0)  # the last finite one, just before
    lr = next(r for r in nan.related if r.metric == "actor/lr")
    assert lr.key == "train/learning_rate"
    assert "rising" in nan.what_to_check
    assert "actor/grad_norm" in nan.detail and "actor/loss" in nan.detail


@pytest.mark.parametrize("held", [True, False], ids=["exploded-and-held", "calm"])
def test_the_nan_finding_says_whether_the_gradient_had_exploded(tmp_path: Path,
                                                                held: bool) -> None:
    """A gradient norm that jumped 100x at step 20 and held there until the NaN at step 35 is
    flat in the steps just before it, yet it had exploded: the check says so, with the step it
    left its level, and not "look for a NaN input"; a calm one says the opposite."""
    rows = trl_curves(fault="nan", at=35)
    for step in range(32, 35):  # trl_curves' blow-up just before the NaN, taken out
        rows[step]["grad_norm"] = 1.0 + 0.01 * step
    if held:
        for step in range(20, 35):
            rows[step]["grad_norm"] = 100.0 + 0.5 * (step % 3)
    write_tensorboard(tmp_path / "run", rows)
    d = diagnose(read_paths([tmp_path])[0][0])
    nan = next(f for f in d.findings if f.alert == "NonFiniteMetric" and f.state == "firing")
    assert nan.step == 35
    if held:
        assert "x its earlier level" in nan.what_to_check
        assert "since step 20: it had exploded before the NaN" in nan.what_to_check
        assert "NaN input" not in nan.what_to_check
    else:
        assert "not exploding (its earlier level: " in nan.what_to_check
        assert "look for a NaN input" in nan.what_to_check
        assert "exploded" not in nan.what_to_check


def test_a_healthy_run_gives_no_critical_finding(tmp_path: Path) -> None:
    write_tensorboard(tmp_path / "run", trl_curves())
    d = diagnose(read_paths([tmp_path])[0][0])
    assert d.worst() != "critical", d.findings


def test_a_truncated_file_is_reported_and_its_start_diagnosed(tmp_path: Path) -> None:
    write_tensorboard(tmp_path / "run", trl_curves(fault="entropy_collapse", at=25))
    (event,) = (tmp_path / "run").iterdir()
    data = event.read_bytes()
    event.write_bytes(data[:int(len(data) * 0.8)])
    runs, problems = read_paths([tmp_path])
    (run,) = runs
    assert problems == []
    (problem,) = run.problems
    assert problem.path == str(event)
    assert "not a complete TensorBoard event file" in problem.message
    assert 28 <= run.steps < 40
    assert fired(diagnose(run).findings)["EntropyCollapse"] == 27


def test_a_file_that_is_no_event_file_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "events.out.tfevents.123.host"
    bad.write_bytes(b"not an event file at all")
    runs, problems = read_paths([bad])
    assert runs == []
    (problem,) = problems
    assert problem.path == str(bad)
    assert "expected TensorBoard event records" in problem.message
