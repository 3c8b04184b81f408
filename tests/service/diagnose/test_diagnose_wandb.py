"""W&B runs written by the W&B SDK itself in offline mode (no network), read back from the run
directory; and history exports. Faults are found at their steps, a healthy run gives no critical
finding, a damaged run file keeps what precedes the damage.

A history export cannot be made offline (W&B's export API reads the server), so the export
tests write the rows read from a real offline run as JSON lines and CSV, the shapes the export
has (a ``_step`` column, empty cells for keys not logged at a step).
"""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlmon.service.diagnose.findings import diagnose
from rlmon.service.diagnose.formats import read_paths
from tests.support.diagnose_support import FAULT_ALERT, fired, trl_curves

_WRITER = """
import json, os, sys, wandb
for spec in json.load(open(sys.argv[1])):
    os.makedirs(spec["dir"], exist_ok=True)
    run = wandb.init(project="diagnose", mode="offline", name=spec["name"], dir=spec["dir"])
    for step, values in sorted(spec["rows"].items(), key=lambda kv: int(kv[0])):
        # as the Hugging Face WandbCallback logs: train/<key> and the trainer's global step
        run.log({**{f"train/{k}": v for k, v in values.items()}, "train/global_step": int(step)})
    run.finish()
"""


def write_wandb(tmp: Path, runs: dict[str, dict[int, dict[str, float]]]) -> dict[str, Path]:
    """One offline run per name, each in its own folder, written by one W&B process."""
    specs = [{"name": name, "dir": str(tmp / name), "rows": {str(k): v for k, v in rows.items()}}
             for name, rows in runs.items()]
    data = tmp / "runs.json"
    data.write_text(json.dumps(specs))  # NaN as a bare token
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    subprocess.run([sys.executable, "-c", _WRITER, str(data)], env=env, check=True,
                   timeout=120, capture_output=True)
    return {name: next((tmp / name / "wandb").glob("offline-run-*")) for name in runs}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    curves = {f"grpo-{fault}": trl_curves(fault=None if fault == "healthy" else fault, at=25)
              for fault in (*sorted(FAULT_ALERT), "healthy")}
    written = write_wandb(tmp_path_factory.mktemp("wandb"), curves)
    return {name.removeprefix("grpo-"): path for name, path in written.items()}


@pytest.mark.parametrize("fault", sorted(FAULT_ALERT))
def test_a_fault_is_found_at_its_step(runs: dict[str, Path], fault: str) -> None:
    found, problems = read_paths([runs[fault].parent.parent])  # the folder holding wandb/
    assert problems == []
    (run,) = found
    assert run.format == "wandb-offline" and run.name == f"grpo-{fault}"
    assert sorted(run.rows) == list(range(1, 41))  # the trainer's steps, not W&B's _step
    d = diagnose(run)
    assert d.keymap.framework == "trl"
    alert, delay = FAULT_ALERT[fault]
    assert fired(d.findings)[alert] == 25 + delay


def test_a_healthy_run_gives_no_critical_finding(runs: dict[str, Path]) -> None:
    (run,), _ = read_paths([runs["healthy"]])
    assert diagnose(run).worst() != "critical"


def test_a_truncated_run_file_keeps_the_records_before(runs: dict[str, Path],
                                                      tmp_path: Path) -> None:
    (source,) = runs["tied_rewards"].glob("run-*.wandb")
    cut = tmp_path / source.name
    data = source.read_bytes()
    cut.write_bytes(data[:int(len(data) * 0.7)])
    (run,), problems = read_paths([cut])
    assert problems == []
    (problem,) = run.problems
    assert problem.path == str(cut) and "truncated" in problem.message
    assert 27 <= max(run.rows) < 40
    assert fired(diagnose(run).findings)["NoLearningSignal"] == 27


def test_history_exports_as_json_lines_and_csv(runs: dict[str, Path], tmp_path: Path) -> None:
    (run,), _ = read_paths([runs["nan"]])
    rows = [{**values, "_step": step} for step, values in run.rows.items()]
    jsonl = tmp_path / "history.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))  # NaN as a bare token
    keys = sorted({k for r in rows for k in r})
    table = tmp_path / "history.csv"
    with table.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, keys)
        writer.writeheader()
        for r in rows:  # a key not logged at a step is an empty cell
            writer.writerow({k: ("" if k == "train/kl" and r["_step"] % 2 else r.get(k, ""))
                             for k in keys})
    found, problems = read_paths([jsonl, table])
    assert problems == []
    assert [r.format for r in found] == ["wandb-history-jsonl", "wandb-history-csv"]
    for exported in found:
        assert math.isnan(exported.rows[25]["train/loss"])
        assert fired(diagnose(exported).findings)["NonFiniteMetric"] == 25
    assert "train/kl" not in found[1].rows[25] and "train/kl" in found[1].rows[26]


def test_a_csv_without_a_step_column_is_named(tmp_path: Path) -> None:
    table = tmp_path / "metrics.csv"
    table.write_text("loss,reward\n1,2\n")
    runs, problems = read_paths([table])
    assert runs == []
    (problem,) = problems
    assert problem.path == str(table) and "step column" in problem.message
