"""A Hugging Face ``trainer_state.json``: the Trainer's ``log_history``, one entry per log call.

The Trainer writes it with ``json.dump``, so NaN and Infinity appear as bare tokens (Python
reads them). Entries of one step (the training log, an evaluation, the closing summary) merge.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from rlmon.service.diagnose.logged_run import LogError, LoggedRun, ReadProblem, run_name, to_float

__all__ = ["FILE_NAME", "read_trainer_state"]

FILE_NAME = "trainer_state.json"


def read_trainer_state(path: Path) -> LoggedRun:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise LogError(str(path), f"cannot read: {exc}") from None
    try:
        state = json.loads(text)
    except json.JSONDecodeError as exc:
        raise LogError(str(path), f"not complete JSON (truncated?): {exc}") from None
    history = state.get("log_history") if isinstance(state, dict) else None
    if not isinstance(history, list):
        raise LogError(str(path), "expected a Hugging Face trainer state: an object with a "
                       "'log_history' list")
    problems = []
    rows: dict[int, dict[str, float]] = defaultdict(dict)
    for index, entry in enumerate(history):
        step = entry.get("step") if isinstance(entry, dict) else None
        if not isinstance(step, int) or isinstance(step, bool):
            problems.append(ReadProblem(f"{path}: log_history[{index}]",
                                        "expected an object with an integer 'step'"))
            continue
        rows[step].update({k: v for k, v in ((k, to_float(v)) for k, v in entry.items())
                           if v is not None})
    label = path.parent.name if path.parent.name else path.stem
    return LoggedRun(str(path), "hf-trainer-state", run_name(label), dict(sorted(rows.items())),
                     problems=tuple(problems))
