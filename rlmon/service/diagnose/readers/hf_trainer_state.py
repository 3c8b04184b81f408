"""A Hugging Face ``trainer_state.json``: the Trainer's ``log_history``, one entry per log call.

The Trainer writes it with ``json.dump``, so NaN and Infinity appear as bare tokens (Python
reads them). Entries of one step (the training log, an evaluation, the closing summary) merge.
The run's settings come from the ``training_args.bin`` beside it, read without unpickling
(:mod:`.training_args`).
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

from rlmon.service.diagnose.logged_run import LogError, LoggedRun, ReadProblem, run_name, to_float
from rlmon.service.diagnose.readers import training_args
from rlmon.service.diagnose.run_settings import Segment, settings_from_config

__all__ = ["FILE_NAME", "read_trainer_state"]

FILE_NAME = "trainer_state.json"
_CHECKPOINT = re.compile(r"checkpoint-(\d+)")


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
    segments, notes = _settings(path.parent / training_args.FILE_NAME, min(rows, default=0))
    return LoggedRun(str(path), "hf-trainer-state", run_name(label), dict(sorted(rows.items())),
                     problems=tuple(problems), segments=segments, notes=notes)


def _checkpoints(state: Path) -> list[tuple[int, Path]]:
    """The checkpoints of the run (``checkpoint-<step>`` beside or under the state's folder)
    up to the state's own, by step, then the state's folder itself."""
    here = state.parent
    own = _CHECKPOINT.fullmatch(here.name)
    root = here.parent if own else here
    limit = int(own.group(1)) if own else None
    found = []
    try:
        for entry in root.iterdir():
            match = _CHECKPOINT.fullmatch(entry.name)
            if match and entry.is_dir() and entry != here and (
                    limit is None or int(match.group(1)) < limit):
                found.append((int(match.group(1)), entry))
    except OSError:
        pass
    return [*sorted(found), (limit if limit is not None else -1, here)]


def _settings(path: Path, first: int) -> tuple[tuple[Segment, ...], tuple[str, ...]]:
    """A segment per change of the settings across the checkpoints' ``training_args.bin``: a
    checkpoint whose settings differ from the one before starts at the step after it (the
    Trainer resumes from the latest checkpoint, so the change is placed there; said in notes)."""
    segments: list[Segment] = []
    notes: list[str] = []
    previous_step = None
    for step, folder in _checkpoints(path):
        args = folder / training_args.FILE_NAME
        if not args.exists():
            previous_step = step
            continue
        try:
            fields = training_args.read_training_args(args)
        except ValueError as exc:
            notes.append(f"{args}: its settings cannot be read safely ({exc})")
            previous_step = step
            continue
        settings = settings_from_config(fields, f"{folder.name}/{args.name}")
        if settings.known and (not segments or segments[-1].settings.known != settings.known):
            start = first if not segments or previous_step is None else previous_step + 1
            segments.append(Segment(start, settings, str(args)))
        previous_step = step
    if len(segments) > 1:
        notes.append("the settings changed between checkpoints: each change is placed at the "
                     "step after the checkpoint before it (where a resume would start)")
    if not segments and not notes:
        notes.append(f"no {training_args.FILE_NAME} beside it: the run's settings are unknown")
    return tuple(segments), tuple(notes)