"""W&B runs: an offline run directory (``wandb/offline-run-*``) and history exports.

An offline run's ``run-<id>.wandb`` file is W&B's transaction log: LevelDB log framing (32 KiB
blocks of checksummed chunks) around serialized ``wandb.proto.wandb_internal_pb2.Record``
messages. The W&B SDK no longer ships a Python reader for the framing (its Go core reads it), so
the framing is read here and each record is parsed with W&B's own protobuf classes; history
items carry their value as JSON (``NaN`` and ``Infinity`` included).

The step of a row is the trainer's when the row names it (``train/global_step``, as the Hugging
Face callback logs it, or ``global_step``), else W&B's ``_step``. A history export is the same
rows as JSON lines or CSV (an empty cell or a null is a key not logged at that step).
"""

from __future__ import annotations

import csv
import struct
import zlib
from collections import defaultdict
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from rlmon.service.diagnose.logged_run import (
    LogError,
    LoggedRun,
    ReadProblem,
    checked_step,
    run_name,
    to_float,
)
from rlmon.service.diagnose.readers.json_lines import MAX_LINE_BYTES, objects
from rlmon.service.diagnose.run_settings import Segment, flatten, settings_from_config
from rlmon.service.input_files import (
    InputFileError,
    LineTooLong,
    bounded_lines,
    open_regular,
    read_bounded,
)
from rlmon.service.json_input import loads as bounded_json

__all__ = ["STEP_KEYS", "join_resumed", "read_wandb_csv", "read_wandb_jsonl", "read_wandb_run", "run_files"]

STEP_KEYS = ("train/global_step", "global_step", "trainer/global_step", "_step")
_HEADER = struct.Struct("<4sHB")  # ident, magic, version
_CHUNK = struct.Struct("<IHB")  # checksum (crc32 of type byte and data), length, type
_IDENT, _MAGIC, _VERSION = b":W&B", 0xBEE1, 0
_BLOCK = 32768
MAX_RUN_FILE_BYTES = 4 << 30  # read a block at a time; a million steps is a few hundred MB
MAX_RECORD_BYTES = 64 << 20  # one record (a history row, a config) reassembled from its chunks
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def run_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("run-*.wandb"))


def _payloads(handle: BinaryIO, path: str, problems: list[ReadProblem]) -> Iterator[bytes]:
    """The records' bytes, reassembled from their chunks, read one 32 KiB block at a time (the
    file is never held whole: a sparse 4 GB file costs a block); damage stops the scan,
    reported."""
    block = handle.read(_BLOCK)
    if len(block) < _HEADER.size or _HEADER.unpack_from(block) != (_IDENT, _MAGIC, _VERSION):
        raise LogError(path, "not a W&B transaction log (expected the ':W&B' header)")
    base, at = 0, _HEADER.size  # the block's offset in the file, the chunk's in the block
    pending: list[bytes] = []
    held = 0
    while True:
        if at >= len(block):
            if len(block) < _BLOCK:  # the file's end
                return
            base, block, at = base + len(block), handle.read(_BLOCK), 0
            continue
        if _BLOCK - at < _CHUNK.size:  # the block's trailer
            at = _BLOCK
            continue
        offset = base + at
        if at + _CHUNK.size > len(block):
            problems.append(ReadProblem(path, f"truncated at byte {offset} (a partial chunk "
                                        "header); the records before it are diagnosed"))
            return
        checksum, length, kind = _CHUNK.unpack_from(block, at)
        if kind == 0 and length == 0:  # zero padding after the last record
            return
        body = block[at + _CHUNK.size:at + _CHUNK.size + length]
        if len(body) < length and len(block) < _BLOCK:
            problems.append(ReadProblem(path, f"truncated at byte {offset} (a record cut "
                                        "short); the records before it are diagnosed"))
            return
        if len(body) < length or zlib.crc32(body, zlib.crc32(bytes([kind]))) != checksum \
                or kind not in (_FULL, _FIRST, _MIDDLE, _LAST):
            problems.append(ReadProblem(path, f"corrupt record at byte {offset} (checksum, "
                                        "length or type); the records before it are diagnosed"))
            return
        at += _CHUNK.size + length
        if kind in (_FULL, _FIRST):
            pending, held = [], 0
        pending.append(body)
        held += length
        if held > MAX_RECORD_BYTES:
            problems.append(ReadProblem(path, f"a record before byte {base + at} is longer "
                                        f"than {MAX_RECORD_BYTES} bytes; the records before it "
                                        "are diagnosed"))
            return
        if kind in (_FULL, _LAST):
            yield b"".join(pending)
            pending, held = [], 0


class _BadStep(ValueError):
    """A row's step that is not one (negative, beyond 2^53, fractional): the row is refused."""


def _row(items: Mapping[str, Any]) -> tuple[int | None, dict[str, float]]:
    values = {k: v for k, v in ((k, to_float(v)) for k, v in items.items()) if v is not None}
    key = next((k for k in STEP_KEYS if k in values and values[k] == values[k]), None)
    if key is None:
        return None, values
    step = checked_step(values[key])
    if isinstance(step, str):
        raise _BadStep(f"{key!r} {step}")
    return step, values


def _by_step(logged: list[tuple[int | None, int, dict[str, float]]],
             ) -> dict[int, dict[str, float]]:
    """Rows by the trainer's step. Where the run logs one (``train/global_step``), a row without
    it (TRL's profiling timers, logged straight to W&B during the step) belongs to the next row
    that has it; W&B's own ``_step`` counts log calls, not trainer steps."""
    trainer = any(k in values for _, _, values in logged for k in STEP_KEYS[:-1])
    rows: dict[int, dict[str, float]] = defaultdict(dict)
    pending: list[dict[str, float]] = []
    for step, w_step, values in logged:
        if not trainer:
            rows[w_step if step is None else step].update(values)
            continue
        if step is None or not any(k in values for k in STEP_KEYS[:-1]):
            pending.append(values)
            continue
        for early in pending:
            rows[step].update(early)
        pending.clear()
        rows[step].update(values)
    if pending and rows:
        last = max(rows)
        for early in pending:
            rows[last].update(early)
    return dict(sorted(rows.items()))


def read_wandb_run(path: Path) -> LoggedRun:
    """An offline run directory or its ``run-*.wandb`` file."""
    from wandb.proto import wandb_internal_pb2

    files = run_files(path) if path.is_dir() else [path]
    if not files:
        raise LogError(str(path), "no W&B run file (run-<id>.wandb) in this directory")
    problems: list[ReadProblem] = []
    logged: list[tuple[int | None, int, dict[str, float]]] = []
    config: dict[str, Any] = {}
    name = path.name
    run_id = ""
    for file in files:
        try:
            handle = open_regular(file, MAX_RUN_FILE_BYTES)
        except InputFileError as exc:
            raise LogError(exc.path, exc.message) from None
        with handle:
            for payload in _payloads(handle, str(file), problems):
                record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]
                try:
                    record.ParseFromString(payload)
                except Exception as exc:  # protobuf's DecodeError: name it, go on
                    problems.append(ReadProblem(str(file), f"a record is not a W&B Record: {exc}"))
                    continue
                kind = record.WhichOneof("record_type")
                if kind == "run":
                    name = record.run.display_name or record.run.run_id or name
                    run_id = record.run.run_id or run_id
                    _config(record.run.config, config)
                elif kind == "config":
                    _config(record.config, config)
                elif kind == "history":
                    try:
                        items = {"/".join(i.nested_key) if i.nested_key else i.key:
                                 bounded_json(i.value_json)
                                 for i in record.history.item if i.value_json}
                        step, values = _row(items)
                    except ValueError as exc:  # a bad step, a value not JSON or nested too deeply
                        problems.append(ReadProblem(str(file), f"a history row's {exc}: skipped"))
                        continue
                    logged.append((step, record.history.step.num, values))
    if not logged and not problems:
        raise LogError(str(path), "the W&B run holds no history rows (nothing was logged)")
    rows = _by_step(logged)
    settings = settings_from_config(config, f"{files[0].name} config")
    segments = (Segment(min(rows, default=0), settings, str(files[0]), flatten(config)),) \
        if settings.known or settings.refused else ()
    return LoggedRun(str(path), "wandb-offline", run_name(name), rows,
                     problems=tuple(problems), packages=_requirements(files[0].parent),
                     segments=segments, run_id=run_id)


def join_resumed(runs: list[LoggedRun]) -> list[LoggedRun]:
    """A W&B run resumed offline (``resume=``, the same id) leaves one offline-run directory per
    process, as ``wandb sync`` would join them: one run, a segment per directory, in the
    directories' (start time) order, a later directory's value for a step replacing an
    earlier one's."""
    groups: dict[str, list[LoggedRun]] = {}
    for run in runs:
        groups.setdefault(run.run_id or f"\0{id(run)}", []).append(run)
    out = []
    for group in groups.values():
        if len(group) == 1:
            out.append(group[0])
            continue
        group.sort(key=lambda r: Path(r.source).name)
        rows: dict[int, dict[str, float]] = defaultdict(dict)
        for run in group:
            for step, values in run.rows.items():
                rows[step].update(values)
        first = group[0]
        out.append(LoggedRun(
            first.source, first.format, group[-1].name, dict(sorted(rows.items())),
            problems=tuple(p for r in group for p in r.problems),
            notes=(f"W&B run {first.run_id} resumed: joined {len(group)} offline-run "
                   "directories (" + ", ".join(Path(r.source).name for r in group) + ")",
                   *(n for r in group for n in r.notes)),
            packages=group[-1].packages, segments=tuple(s for r in group for s in r.segments),
            run_id=first.run_id))
    return out


def _config(record: Any, into: dict[str, Any]) -> None:
    """A W&B config record's updates (a ``run.config.update``, the callback's arguments)."""
    for item in record.update:
        key = ".".join(item.nested_key) if item.nested_key else item.key
        try:
            into[key] = bounded_json(item.value_json)
        except ValueError:  # not JSON, or nested too deeply: not a setting
            continue
    for item in record.remove:
        into.pop(".".join(item.nested_key) if item.nested_key else item.key, None)


def _requirements(run_dir: Path) -> dict[str, str]:
    """``name==version`` lines of the ``files/requirements.txt`` W&B saves with a run."""
    try:
        text = read_bounded(run_dir / "files" / "requirements.txt", 1 << 20).decode("utf-8")
    except (InputFileError, UnicodeDecodeError):
        return {}
    pins = (line.strip().split("==", 1) for line in text.splitlines() if "==" in line)
    return {name.strip().lower().replace("_", "-"): version.strip() for name, version in pins}


def read_wandb_jsonl(path: Path) -> LoggedRun:
    problems: list[ReadProblem] = []
    rows: dict[int, dict[str, float]] = defaultdict(dict)
    for number, obj in objects(path, problems):
        try:
            step, values = _row(_flat(obj))
        except _BadStep as exc:
            problems.append(ReadProblem(f"{path}:{number}", str(exc)))
            continue
        if step is None:
            problems.append(ReadProblem(f"{path}:{number}", "a history row without a step ("
                                        + ", ".join(STEP_KEYS) + ")"))
            continue
        rows[step].update(values)
    return LoggedRun(str(path), "wandb-history-jsonl", run_name(path.stem),
                     dict(sorted(rows.items())), problems=tuple(problems))


def read_wandb_csv(path: Path) -> LoggedRun:
    problems: list[ReadProblem] = []
    rows: dict[int, dict[str, float]] = defaultdict(dict)
    try:
        with open_regular(path) as handle:
            reader = csv.DictReader(_csv_lines(path, handle))
            fields = reader.fieldnames or []
            if not any(k in fields for k in STEP_KEYS):
                raise LogError(str(path), "expected a W&B history export: a CSV header with a "
                               "step column (" + ", ".join(STEP_KEYS) + ")")
            for number, row in enumerate(reader, start=2):
                if None in row or any(v is None for v in row.values()):
                    problems.append(ReadProblem(f"{path}:{number}", "the row has "
                                                "another number of cells than the header"))
                    continue
                try:
                    step, values = _row({k: v for k, v in row.items() if v != ""})
                except _BadStep as exc:
                    problems.append(ReadProblem(f"{path}:{number}", str(exc)))
                    continue
                if step is None:
                    problems.append(ReadProblem(f"{path}:{number}", "no step in this row"))
                    continue
                rows[step].update(values)
    except InputFileError as exc:
        raise LogError(exc.path, exc.message) from None
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise LogError(str(path), f"cannot read as CSV: {exc}") from None
    return LoggedRun(str(path), "wandb-history-csv", run_name(path.stem),
                     dict(sorted(rows.items())), problems=tuple(problems))


def _csv_lines(path: Path, handle: BinaryIO) -> Iterator[str]:
    """The file's lines for the CSV reader, each read in chunks and bounded (the csv module's
    own field limit bounds a field, not a line)."""
    for line in bounded_lines(handle, MAX_LINE_BYTES):
        if isinstance(line, LineTooLong):
            raise InputFileError(path, f"a {line}: the rows after it are not read")
        yield line.decode("utf-8") + "\n"


def _flat(obj: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in obj.items():
        if isinstance(value, dict) and not value.get("_type"):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out
