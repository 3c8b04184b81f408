"""Bounded work for any input (issue 40, E2, E3, E6): step times and costs from step gaps in
memory that follows the logged entries, not the steps between them; numbers a log carries (a
world size, a time) and the command line (a price) range-checked with an error naming the
field; absurd or infinite times never printed as ``inf h`` nor break ``--json``; one run that
cannot be diagnosed never costs the others their output."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from rlmon.cli import main
from rlmon.service.diagnose.findings import diagnose
from rlmon.service.diagnose.formats import read_paths
from tests.service.diagnose.test_diagnose_settings import write_segment
from tests.support.diagnose_support import trl_curves
from tests.unit.diagnose.test_diagnose_trainer_state import write_state

HUGE = 2**53 - 1


def _limit_memory() -> None:  # filling 2^53 steps hits MemoryError at once, not the machine
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def _trainer_state(path: Path, rows: list[dict[str, object]]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "trainer_state.json").write_text(json.dumps(
        {"global_step": max(int(str(r["step"])) for r in rows), "log_history": rows}))
    return path


def _wandb_jsonl(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _tensorboard(directory: Path, steps: dict[int, float]) -> Path:
    """Scalars at ``steps`` written at the given wall times."""
    from tensorboard.compat.proto import event_pb2
    from tensorboard.plugins.scalar.summary_v2 import scalar_pb
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    directory.mkdir(parents=True)
    writer = EventFileWriter(str(directory))
    for step, wall in steps.items():
        writer.add_event(event_pb2.Event(wall_time=wall, step=step,
                                         summary=scalar_pb("train/loss", 0.5)))
    writer.close()
    return directory


def _gap_logs(tmp: Path) -> dict[str, Path]:
    """Three entries, steps 1 to 2^53-1, in each format that tells time by the gaps."""
    return {
        "train_runtime": _trainer_state(tmp / "state", [
            {"step": 1, "loss": 0.5}, {"step": HUGE, "loss": 0.4},
            {"step": HUGE, "train_runtime": 3600.0, "train_loss": 0.4}]),
        "wandb": _wandb_jsonl(tmp / "history.jsonl", [
            {"_step": 1, "loss": 0.5, "_timestamp": 1.7e9},
            {"_step": 2, "loss": 0.5, "_timestamp": 1.7e9 + 10},
            {"_step": HUGE, "loss": 0.4, "_timestamp": 1.7e9 + 7200}]),
        "tensorboard": _tensorboard(tmp / "tb", {1: 1.7e9, 2: 1.7e9 + 10, HUGE: 1.7e9 + 7200}),
    }


@pytest.mark.parametrize("kind", ["train_runtime", "wandb", "tensorboard"])
def test_a_gap_of_2_53_steps_costs_nothing(tmp_path: Path, kind: str) -> None:
    """Was 73 s to a MemoryError at 5.6 GB: every step of the gap was filled one at a time.
    In a child under a 2 GiB address-space limit, so the old code fails at once."""
    path = _gap_logs(tmp_path)[kind]
    out = subprocess.run(
        [sys.executable, "-m", "rlmon", "diagnose", str(path), "--json", "--gpus", "8",
         "--price-per-gpu-hour", "2"], capture_output=True, text=True, timeout=120,
        preexec_fn=_limit_memory)
    assert "Traceback" not in out.stderr, out.stderr
    source = json.loads(out.stdout.splitlines()[0])
    cost = source["cost"]
    assert cost["steps"] == HUGE
    # the gaps' time (plus, for the first logged step, the median gap's share)
    assert cost["seconds"] == pytest.approx({"train_runtime": 3600.0}.get(kind, 7200.0), abs=10)
    for line in out.stdout.splitlines():
        json.loads(line)  # every line JSON


def test_a_finding_span_over_the_gap_is_priced_from_its_runs(tmp_path: Path) -> None:
    (run,), _ = read_paths([_gap_logs(tmp_path)["wandb"]])
    d = diagnose(run, gpus=2, price=1.0)
    clock = d.clock
    assert clock is not None and clock.last_step == HUGE and clock.steps == HUGE
    per_step = (7200.0 - 10) / (HUGE - 2)
    assert clock.span(3, 1002, "x").seconds == pytest.approx(1000 * per_step)
    # step 2: its gap's 10 s; step 1: the median of the two gaps' shares, (10 + ~0) / 2
    assert clock.span(1, 2, "x").seconds == pytest.approx(15.0)
    assert clock.seconds_per_step == pytest.approx(per_step)
    assert "inf" not in clock.describe()


@pytest.mark.parametrize("times", [
    {1: 1.7e9, 2: 1e300, 3: 1.7e9 + 20},  # an absurd wall time between good ones
    {1: -1e308, 2: 1.7e9, 3: 1.7e9 + 20},
    {1: 1.7e9, 2: 1.7e9 + 10, 3: 1.7e9 + 1e9},  # a step of 30 years
    {1: 1.7e9, 2: float("inf"), 3: 1.7e9 + 20},
])
def test_absurd_tensorboard_times_are_refused_by_name(tmp_path: Path,
                                                       times: dict[int, float],
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    path = _tensorboard(tmp_path / "tb", times)
    main(["diagnose", str(path), "--gpus", "8", "--price-per-gpu-hour", "3"])
    text = capsys.readouterr().out
    assert "inf h" not in text and "$inf" not in text and "e+299" not in text
    assert "refused TensorBoard wall time" in text or "refused the TensorBoard wall time gap" \
        in text, text
    assert main(["diagnose", str(path), "--json"]) in (0, 2)
    for line in capsys.readouterr().out.splitlines():
        json.loads(line)


@pytest.mark.parametrize("value", [1e300, float("inf"), -5.0])
def test_absurd_logged_step_times_are_refused_and_json_never_fails(
        tmp_path: Path, value: float, capsys: pytest.CaptureFixture[str]) -> None:
    rows: list[dict[str, object]] = [
        {"step": s, "loss": 0.5, "step_time": 2.0} for s in range(1, 10)]
    rows.append({"step": 10, "loss": 0.5, "step_time": value})
    path = tmp_path / "state"
    path.mkdir()
    (path / "trainer_state.json").write_text(
        json.dumps({"global_step": 10, "log_history": rows}))  # Infinity as a bare token
    assert main(["diagnose", str(path), "--json", "--gpus", "8",
                 "--price-per-gpu-hour", "3"]) in (0, 2)
    source = json.loads(capsys.readouterr().out.splitlines()[0])
    assert source["cost"]["seconds"] == pytest.approx(18.0)
    assert source["cost"]["refused"] and "step_time at step 10" in source["cost"]["refused"][0]


@pytest.mark.parametrize("world", ["9" * 600, 1e300, "1" * 5000, 2**64])
def test_an_absurd_world_size_is_refused_by_name_and_the_run_diagnosed(
        tmp_path: Path, world: object, capsys: pytest.CaptureFixture[str]) -> None:
    """A 600-digit world size aborted every run on the command line (OverflowError); 1e300 was
    priced as 1.11e+299 GPU-hours. A second, sound run on the same command line keeps its
    output."""
    bad, good = tmp_path / "bad", tmp_path / "good"
    rows = {s: {**v, "step_time": 10.0} for s, v in trl_curves().items()}
    write_segment(bad, {"world_size": world, "gradient_accumulation_steps": 2}, rows)
    write_state(good / "trainer_state.json", trl_curves())
    status = main(["diagnose", str(bad), str(good), "--price-per-gpu-hour", "3"])
    captured = capsys.readouterr()
    assert status == 2  # an input problem, named
    assert "world_size = " in captured.err and "refused" in captured.err
    assert captured.out.count("framework:") == 2  # both runs diagnosed
    assert "GPUs unknown" in captured.out  # not priced from the refused world size
    assert "gradient_accumulation_steps=2" in captured.out  # the sound settings still read
    main(["diagnose", str(bad), "--json"])
    for line in capsys.readouterr().out.splitlines():
        json.loads(line)


@pytest.mark.parametrize("option", ["--price-per-gpu-hour", "--gpus"])
@pytest.mark.parametrize("value", ["1e300", "inf", "nan", "-1"])
def test_an_absurd_price_or_gpu_count_is_a_usage_error(
        tmp_path: Path, option: str, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_state(tmp_path / "trainer_state.json", trl_curves())
    with pytest.raises(SystemExit) as exited:
        main(["diagnose", str(path), option, value])
    assert exited.value.code == 2
    assert option in capsys.readouterr().err


@pytest.mark.parametrize("price", ["1e300", "inf", "-1"])
def test_an_absurd_configured_price_is_a_config_error_naming_it(
        tmp_path: Path, price: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlmon.service.config import ConfigError, load_config

    monkeypatch.setenv("RLMON_GOODPUT__PRICE_PER_GPU_HOUR", price)
    with pytest.raises(ConfigError, match=r"goodput\.price_per_gpu_hour"):
        load_config(None, only=("goodput",))
