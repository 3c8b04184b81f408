"""Which log a path holds, told from the files themselves, and reading it.

A file is recognised by its name where the writer fixes one (``events.out.tfevents.*``,
``run-<id>.wandb``, ``trainer_state.json``), else by its content: the SQLite header of a history
store, or the first JSON line's shape (a partial report, verl's ``{"step", "data"}``, a W&B
history row with ``_step``). A directory is searched for those files; Hugging Face checkpoints
each copy the trainer state, so only the most advanced ``trainer_state.json`` of a tree is read.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import replace
from enum import StrEnum
from pathlib import Path

from rlmon.service.diagnose.logged_run import LogError, LoggedRun, ReadProblem
from rlmon.service.diagnose.readers import (
    framework_jsonl,
    hf_trainer_state,
    rlmon_files,
    tensorboard,
    wandb,
)
from rlmon.service.diagnose.readers.json_lines import first_object
from rlmon.service.input_files import InputFileError, open_regular, regular_size

__all__ = ["EXPECTED", "Format", "detect", "read_paths"]


class Format(StrEnum):
    TENSORBOARD = "tensorboard"
    WANDB_OFFLINE = "wandb-offline"
    WANDB_JSONL = "wandb-history-jsonl"
    WANDB_CSV = "wandb-history-csv"
    HF_TRAINER_STATE = "hf-trainer-state"
    VERL_FILE = "verl-file-logger"
    RLMON_PARTIALS = "rlmon-partial-reports"
    RLMON_HISTORY = "rlmon-history"


EXPECTED = ("a TensorBoard log directory or events.out.tfevents.* file, a W&B offline run "
            "(wandb/offline-run-*, run-*.wandb) or history export (.jsonl, .csv with _step), a "
            "Hugging Face trainer_state.json, verl's file-logger JSON lines, an rlmon "
            "partial-report file or history store")

_MAX_DEPTH = 6


def _sniff(path: Path) -> Format | None:
    """The format of a file (None: not recognised); LogError for a file that is not a regular
    one (a FIFO would hang the read, a device never end), refused before it is opened."""
    try:
        regular_size(path)
    except InputFileError as exc:
        raise LogError(exc.path, exc.message) from None
    name = path.name
    if tensorboard.EVENT_FILE_MARK in name:
        return Format.TENSORBOARD
    if name.startswith("run-") and name.endswith(".wandb"):
        return Format.WANDB_OFFLINE
    if name == hf_trainer_state.FILE_NAME:
        return Format.HF_TRAINER_STATE
    try:
        with open_regular(path) as handle:
            head = handle.read(len(rlmon_files.SQLITE_MAGIC))
    except InputFileError as exc:
        raise LogError(exc.path, exc.message) from None
    except OSError:
        return None
    if head == rlmon_files.SQLITE_MAGIC:
        return Format.RLMON_HISTORY
    if path.suffix.lower() == ".csv":
        return Format.WANDB_CSV
    if path.suffix.lower() == ".json":
        return Format.HF_TRAINER_STATE if hf_trainer_state.has_log_history(path) else None
    obj = first_object(path)
    if obj is None:
        return None
    if rlmon_files.is_partial_report(obj):
        return Format.RLMON_PARTIALS
    if framework_jsonl.is_verl_line(obj):
        return Format.VERL_FILE
    if any(k in obj for k in wandb.STEP_KEYS):
        return Format.WANDB_JSONL
    return None


def detect(directory: Path, refused: list[ReadProblem] | None = None,
           ) -> list[tuple[Format, Path]]:
    """The logs under a directory, each once: a TensorBoard run per directory of event files,
    a W&B run per offline-run directory, the latest trainer state, the other files by content;
    a candidate that is not a regular file goes to ``refused``."""
    found: list[tuple[Format, Path]] = []
    states: list[Path] = []
    for root, dirs, files in os.walk(directory):
        here = Path(root)
        depth = len(here.relative_to(directory).parts)
        dirs[:] = sorted(d for d in dirs if depth < _MAX_DEPTH and not d.startswith("."))
        if wandb.run_files(here):
            found.append((Format.WANDB_OFFLINE, here))
            dirs[:] = []
            continue
        if tensorboard.event_files(here):
            found.append((Format.TENSORBOARD, here))
        for name in sorted(files):
            path = here / name
            if tensorboard.EVENT_FILE_MARK in name or name.endswith(".log"):
                continue
            if name == hf_trainer_state.FILE_NAME:
                states.append(path)
                continue
            if path.suffix.lower() not in (".jsonl", ".json", ".csv", ".db", ".sqlite",
                                           ".sqlite3"):
                continue
            try:
                fmt = _sniff(path)
            except LogError as exc:
                if refused is not None:
                    refused.append(ReadProblem(exc.path, exc.message))
                continue
            if fmt is not None and fmt is not Format.HF_TRAINER_STATE:
                found.append((fmt, path))
            elif fmt is Format.HF_TRAINER_STATE:
                states.append(path)
    if states:
        found.append((Format.HF_TRAINER_STATE, max(states, key=hf_trainer_state.global_step)))
    return found


_READERS: dict[Format, Callable[[Path], list[LoggedRun]]] = {
    Format.TENSORBOARD: lambda p: [tensorboard.read_tensorboard(p if p.is_dir() else p.parent)],
    Format.WANDB_OFFLINE: lambda p: [wandb.read_wandb_run(p)],
    Format.WANDB_JSONL: lambda p: [wandb.read_wandb_jsonl(p)],
    Format.WANDB_CSV: lambda p: [wandb.read_wandb_csv(p)],
    Format.HF_TRAINER_STATE: lambda p: [hf_trainer_state.read_trainer_state(p)],
    Format.VERL_FILE: lambda p: [framework_jsonl.read_verl_file(p)],
    Format.RLMON_PARTIALS: rlmon_files.read_partial_reports,
    Format.RLMON_HISTORY: rlmon_files.read_history_store,
}


def _targets(path: Path, refused: list[ReadProblem]) -> list[tuple[Format, Path]]:
    if not path.exists():
        raise LogError(str(path), "no such file or directory")
    if path.is_dir():
        found = detect(path, refused)
        if not found and not refused:
            raise LogError(str(path), f"no log recognised in this directory; expected {EXPECTED}")
        return found
    fmt = _sniff(path)
    if fmt is None:
        raise LogError(str(path), f"format not recognised; expected {EXPECTED}")
    if fmt is Format.TENSORBOARD:
        return [(fmt, path.parent)] if len(tensorboard.event_files(path.parent)) == 1 else \
            [(fmt, path)]
    return [(fmt, path)]


def read_paths(paths: Iterable[str | Path]) -> tuple[list[LoggedRun], list[ReadProblem]]:
    """Every run the paths hold, and the files that could not be read (never raises for bad
    input: each problem names its file and what was expected)."""
    runs: list[LoggedRun] = []
    problems: list[ReadProblem] = []
    seen: set[tuple[Format, Path]] = set()
    for given in paths:
        path = Path(given)
        try:
            targets = _targets(path, problems)
        except LogError as exc:
            problems.append(ReadProblem(exc.path, exc.message))
            continue
        for fmt, target in targets:
            if (fmt, target.resolve()) in seen:
                continue
            seen.add((fmt, target.resolve()))
            try:
                if fmt is Format.TENSORBOARD and target.is_file():
                    runs.append(tensorboard.read_tensorboard(target.parent, [target]))
                else:
                    runs.extend(_READERS[fmt](target))
            except LogError as exc:
                problems.append(ReadProblem(exc.path, exc.message))
            except (ValueError, ArithmeticError, RecursionError, MemoryError) as exc:
                # a reader's unforeseen failure on hostile input costs this file, never the
                # other paths' runs
                problems.append(ReadProblem(str(target), f"cannot be read: "
                                            f"{type(exc).__name__}: {str(exc)[:200]}"))
    offline = [r for r in runs if r.format == Format.WANDB_OFFLINE.value]
    if len(offline) > 1:
        joined, kept = wandb.join_resumed(offline), []
        for run in runs:  # the W&B runs where the first of them was
            if run.format != Format.WANDB_OFFLINE.value:
                kept.append(run)
            elif joined:
                kept.extend(joined)
                joined = []
        runs = kept
    return [_with_refusals(run) for run in runs], problems


def _with_refusals(run: LoggedRun) -> LoggedRun:
    """Settings values out of range are input problems, named by key (the rest is used)."""
    refused = [ReadProblem(segment.source, f"setting {text}: refused")
               for segment in run.segments for text in segment.settings.refused]
    return replace(run, problems=(*run.problems, *refused)) if refused else run

