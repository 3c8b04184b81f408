"""The JSON lines a framework writes when asked to log to a file.

Of the frameworks rlmon integrates with, verl has such a format: its ``file`` tracking backend
(``verl.utils.tracking.FileLogger``, ``trainer.logger=[file]``) writes ``{"step": N, "data":
{key: value}}`` per step with orjson, which writes NaN and Infinity as ``null``: a null here is
read as NaN (said in the run's notes). OpenRLHF and SkyRL log to W&B, TensorBoard, MLflow or the
console only (SkyRL's console logger prints rounded, pretty-printed text, not a file format);
their runs are read from those.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from rlmon.service.diagnose.logged_run import (
    LoggedRun,
    ReadProblem,
    checked_step,
    run_name,
    to_float,
)
from rlmon.service.diagnose.readers.json_lines import objects

__all__ = ["is_verl_line", "read_verl_file"]

NULL_NOTE = ("verl's file logger writes NaN and Infinity as null (orjson): a null value is read "
             "as NaN")


def is_verl_line(obj: dict[str, Any]) -> bool:
    return set(obj) == {"step", "data"} and isinstance(obj["data"], dict)


def _flat(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}/"))
        else:
            out[f"{prefix}{key}"] = value
    return out


def read_verl_file(path: Path) -> LoggedRun:
    problems: list[ReadProblem] = []
    rows: dict[int, dict[str, float]] = defaultdict(dict)
    nulls = 0
    for number, obj in objects(path, problems):
        if not is_verl_line(obj):
            problems.append(ReadProblem(f"{path}:{number}", "expected verl's file logger line "
                                        '{"step": <int>, "data": {...}}'))
            continue
        step = checked_step(obj["step"])
        if isinstance(step, str):
            problems.append(ReadProblem(f"{path}:{number}", f"'step' {step}"))
            continue
        for key, value in _flat(obj["data"]).items():
            if value is None:
                nulls += 1
                rows[step][key] = math.nan
                continue
            number_value = to_float(value)
            if number_value is not None:
                rows[step][key] = number_value
    notes = (f"{NULL_NOTE} ({nulls} values)",) if nulls else ()
    return LoggedRun(str(path), "verl-file-logger", run_name(path.stem),
                     dict(sorted(rows.items())), framework="verl", problems=tuple(problems),
                     notes=notes)
