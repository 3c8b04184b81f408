"""A generated run written by each format's own writer and read back as rlmon reads it:
TensorBoard (tensorboard's event writer: float32 scalars under ``train/``), a Hugging Face
``trainer_state.json`` (transformers' ``TrainerState``: float64 JSON), a W&B offline run (wandb
itself, in a subprocess, as a trainer logs) and rlmon's partial-report JSON lines (the catalog's
names, ``{"value": x}`` partials)."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from bench.claims.runs import CANONICAL, GeneratedRun
from rlmon.service.diagnose.formats import read_paths
from rlmon.service.diagnose.logged_run import LoggedRun
from rlmon.service.metrics.catalog import CATALOG
from rlmon.service.metrics.forms import Form

__all__ = ["FORMATS", "read", "write"]


def _tensorboard(run: GeneratedRun, directory: Path) -> Path:
    from tensorboard.compat.proto import event_pb2
    from tensorboard.plugins.scalar.summary_v2 import scalar_pb
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    directory.mkdir(parents=True, exist_ok=True)
    writer = EventFileWriter(str(directory))
    for step, values in run.rows.items():
        for key, value in values.items():
            writer.add_event(event_pb2.Event(wall_time=1.0 + step, step=step,
                                             summary=scalar_pb(f"train/{key}", value)))
    writer.close()
    return directory


def _trainer_state(run: GeneratedRun, directory: Path) -> Path:
    from transformers import TrainerState

    history: list[dict[str, float]] = [{**values, "step": step}
                                       for step, values in run.rows.items()]
    last = max(run.rows)
    history.append({"train_runtime": sum(v["step_time"] for v in run.rows.values()),
                    "step": last})
    state = TrainerState(global_step=last, max_steps=last, log_history=history)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "trainer_state.json"
    state.save_to_json(str(path))
    return path


_WANDB = """
import json, sys, wandb
spec = json.load(open(sys.argv[1]))
run = wandb.init(project="claims", mode="offline", name=spec["name"], dir=spec["dir"])
for step, values in spec["rows"]:
    run.log({"train/" + k: v for k, v in values.items()}, step=step)
run.finish()
"""


def _wandb(run: GeneratedRun, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    spec = directory / "spec.json"
    rows = [[step, {k: (v if math.isfinite(v) else str(v)) for k, v in values.items()}]
            for step, values in sorted(run.rows.items())]
    spec.write_text(json.dumps({"name": run.name, "dir": str(directory), "rows": rows}))
    script = _WANDB.replace("run.log({", "run.log({k: (float(v) if isinstance(v, str) else v) "
                            "for k, v in {").replace("for k, v in values.items()}, step",
                                                     "for k, v in values.items()}.items()}, step")
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true",
           "WANDB_DIR": str(directory)}
    subprocess.run([sys.executable, "-c", script, str(spec)], env=env, check=True, timeout=300,
                   capture_output=True)
    return directory / "wandb"


def _partial(name: str, value: float) -> dict[str, float] | None:
    """One rank's partial in the form the catalog defines for ``name`` (a mean: one sample;
    None for a form one value cannot fill, such as moments)."""
    form = CATALOG[name].forms[0]
    return {Form.MEAN: {"sum": value, "count": 1.0}, Form.SUM: {"sum": value},
            Form.VALUE: {"value": value}, Form.MIN: {"min": value},
            Form.MAX: {"max": value}}.get(form)


def _rlmon(run: GeneratedRun, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "partials.jsonl"
    names = {**CANONICAL, "step_time": "perf/step_seconds"}
    with path.open("w") as handle:
        for step, values in sorted(run.rows.items()):
            metrics = {names[k]: partial for k, v in values.items()
                       if k in names and math.isfinite(v)
                       and (partial := _partial(names[k], v)) is not None}
            handle.write(json.dumps({"run": re.sub(r"[^A-Za-z0-9_.:-]", "_", run.name),
                                     "role": "actor",
                                     "step": step, "metrics": metrics}) + "\n")
    return path


FORMATS: dict[str, Callable[[GeneratedRun, Path], Path]] = {
    "tensorboard": _tensorboard, "trainer-state": _trainer_state, "wandb-offline": _wandb,
    "rlmon-jsonl": _rlmon}


def write(run: GeneratedRun, fmt: str, directory: Path) -> Path:
    """``run`` written in ``fmt`` under ``directory``; the path rlmon is given."""
    return FORMATS[fmt](run, directory / fmt)


def read(path: Path) -> LoggedRun:
    runs, problems = read_paths([path])
    if problems or len(runs) != 1:
        raise RuntimeError(f"{path}: read as {len(runs)} runs, problems {problems}")
    return runs[0]
