"""A Hugging Face ``trainer_state.json``: the Trainer's ``log_history``, one entry per log call.

The Trainer writes it with ``json.dump``, so NaN and Infinity appear as bare tokens (Python
reads them). Entries of one step (the training log, an evaluation, the closing summary) merge.
The run's settings come from the ``training_args.bin`` beside it, read without unpickling
(:mod:`.training_args`).
"""

from __future__ import annotations

import re
from pathlib import Path

from rlmon.service.contract.records import MAX_STEP
from rlmon.service.diagnose.columns import RowsBuilder
from rlmon.service.diagnose.logged_run import (
    LogError,
    LoggedRun,
    ReadProblem,
    checked_step,
    run_name,
    to_float,
)
from rlmon.service.diagnose.readers import training_args
from rlmon.service.diagnose.readers.json_stream import JsonStream, JsonStreamError
from rlmon.service.diagnose.run_settings import Segment, flatten, settings_from_config
from rlmon.service.input_files import InputFileError, open_regular

__all__ = ["FILE_NAME", "MAX_STATE_BYTES", "global_step", "has_log_history",
           "read_trainer_state"]

FILE_NAME = "trainer_state.json"
MAX_STATE_BYTES = 8 << 30  # read a value at a time: memory follows the values, not the file
_CHECKPOINT = re.compile(r"checkpoint-(\d+)")
_FLOATS = frozenset({float})


def _open(path: Path) -> JsonStream:
    try:
        return JsonStream(open_regular(path, MAX_STATE_BYTES))
    except InputFileError as exc:
        raise LogError(str(path), exc.message) from None


def global_step(path: Path) -> int:
    """The state's ``global_step`` (-1 when it cannot be read), read without its history where
    the key comes first (the Trainer sorts the keys)."""
    try:
        with _open(path) as stream:
            for key in stream.object_items():
                if key == "global_step":
                    value = stream.value()
                    return value if isinstance(value, int) and not isinstance(value, bool) \
                        else -1
                if key == "log_history" and stream.peek() == "[":
                    for _ in stream.array_items():
                        pass
                else:
                    stream.value()
    except (LogError, JsonStreamError, OSError):
        return -1
    return -1


def has_log_history(path: Path) -> bool:
    """Whether a JSON file is an object with a top-level ``log_history`` (format detection)."""
    try:
        with _open(path) as stream:
            for key in stream.object_items():
                if key == "log_history":
                    return stream.peek() == "["
                stream.value()
    except (LogError, JsonStreamError, OSError):
        return False
    return False


def read_trainer_state(path: Path) -> LoggedRun:
    """The log history, read an entry at a time (:mod:`.json_stream`): memory holds the values
    kept, not the file."""
    stream = _open(path)
    problems: list[ReadProblem] = []
    rows = RowsBuilder()
    found = False
    try:
        for key in stream.object_items():
            if key != "log_history" or found:
                stream.value()
                continue
            if stream.peek() != "[":
                break
            found = True
            add = rows.add
            for index, entry in enumerate(stream.array_items()):
                # most entries: an object of floats with an integer step in range, taken as
                # they are (the step as a float too, as to_float gives it); else _entry
                if type(entry) is dict:
                    step = entry.get("step")
                    if type(step) is int and 0 <= step <= MAX_STEP:
                        entry["step"] = float(step)
                        if set(map(type, entry.values())) <= _FLOATS:
                            add(step, entry)
                            continue
                        entry["step"] = step
                _entry(path, index, entry, rows, problems)
    except JsonStreamError as exc:
        if not rows.steps:
            raise LogError(str(path), str(exc)) from None
        problems.append(ReadProblem(str(path), f"{exc}; the entries before it are diagnosed"))
    except OSError as exc:
        raise LogError(str(path), f"cannot read: {exc.strerror or exc}") from None
    finally:
        stream.close()
    if not found:
        raise LogError(str(path), "expected a Hugging Face trainer state: an object with a "
                       "'log_history' list")
    label = path.parent.name if path.parent.name else path.stem
    built = rows.build()
    segments, notes = _settings(path.parent / training_args.FILE_NAME, min(built, default=0))
    return LoggedRun(str(path), "hf-trainer-state", run_name(label), built,
                     problems=tuple(problems), segments=segments, notes=notes)


def _entry(path: Path, index: int, entry: object, rows: RowsBuilder,
           problems: list[ReadProblem]) -> None:
    where = f"{path}: log_history[{index}]"
    if not isinstance(entry, dict):
        problems.append(ReadProblem(where, "expected an object with an integer 'step'"))
        return
    step = checked_step(entry.get("step"))
    if isinstance(step, str):
        problems.append(ReadProblem(where, f"'step' {step}"))
        return
    row = {}
    for key, value in entry.items():
        if type(value) is float:  # most values: to_float's answer, without the call
            row[key] = value
            continue
        number = to_float(value)
        if number is not None:
            row[key] = number
    rows.add(step, row)


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
        if (settings.known or settings.refused) and (
                not segments or segments[-1].settings.known != settings.known):
            start = first if not segments or previous_step is None else previous_step + 1
            segments.append(Segment(start, settings, str(args), flatten(fields)))
        previous_step = step
    if len(segments) > 1:
        notes.append("the settings changed between checkpoints: each change is placed at the "
                     "step after the checkpoint before it (where a resume would start)")
    if not segments and not notes:
        notes.append(f"no {training_args.FILE_NAME} beside it: the run's settings are unknown")
    return tuple(segments), tuple(notes)