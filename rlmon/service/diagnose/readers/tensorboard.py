"""TensorBoard event files: TensorBoard's record framing, checked with its own checksum, and
its event protos.

Every directory holding ``events.out.tfevents.*`` files is one run (TensorBoard's own notion of
a run); its files are read in name order (the writer's start time) and a later file's value for
a (step, tag) replaces an earlier one, as after a restart. Scalars written either way are read:
``simple_value`` (torch.utils.tensorboard, the Hugging Face callback) and scalar tensors
(``tensorboard.summary``), both through :func:`tensorboard.data_compat.migrate_value`. A
truncated or corrupt file keeps the events before the damage and is reported.

A record's length is checked against what is left of the file before anything is allocated
for it (a 28-byte file claiming a 2^62-byte record is damage, not a ``MemoryError``); the file
itself must be a regular file of at most ``MAX_EVENT_FILE_BYTES``.

Each file is a segment of the run (one process's writing): a text summary holding a JSON
object (the Hugging Face callback writes its ``TrainingArguments`` so, under ``args``) gives the
settings that file was written with.
"""

from __future__ import annotations

import struct
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from rlmon.service.diagnose.logged_run import (
    LogError,
    LoggedRun,
    ReadProblem,
    checked_step,
    run_name,
)
from rlmon.service.diagnose.run_settings import Segment, flatten, settings_from_config
from rlmon.service.input_files import InputFileError, open_regular
from rlmon.service.json_input import loads as bounded_json

__all__ = ["EVENT_FILE_MARK", "MAX_EVENT_FILE_BYTES", "event_files", "read_tensorboard"]

EVENT_FILE_MARK = "tfevents"
MAX_EVENT_FILE_BYTES = 4 << 30
_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")
_SCALARS = "scalars"
_TEXT = "text"


def event_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.is_file() and EVENT_FILE_MARK in p.name)


class _Damage(Exception):
    """Where and how the framing broke; the records before it were read."""


def _records(handle: BinaryIO, size: int) -> Iterator[bytes]:
    """The records of an event file (TFRecord framing: a length, its masked CRC-32C, the data,
    its masked CRC-32C), each length checked against the bytes left before it is read."""
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    offset = 0
    while True:
        header = handle.read(_LENGTH.size + _CRC.size)
        if not header:
            return
        if len(header) < _LENGTH.size + _CRC.size:
            raise _Damage(f"truncated record header at byte {offset}")
        length_bytes = header[:_LENGTH.size]
        if masked_crc32c(length_bytes) != _CRC.unpack_from(header, _LENGTH.size)[0]:
            raise _Damage(f"record header at byte {offset} fails its crc32 check")
        (length,) = _LENGTH.unpack(length_bytes)
        left = size - offset - len(header) - _CRC.size
        if length > left:
            raise _Damage(f"the record at byte {offset} claims {length} bytes, more than the "
                          f"{max(left, 0)} left in the file")
        data = handle.read(length)
        crc = handle.read(_CRC.size)
        if len(data) < length or len(crc) < _CRC.size:
            raise _Damage(f"truncated record at byte {offset}")
        if masked_crc32c(data) != _CRC.unpack(crc)[0]:
            raise _Damage(f"the record at byte {offset} fails its crc32 check")
        offset += len(header) + length + _CRC.size
        yield data


def _read_file(path: Path, rows: dict[int, dict[str, float]], texts: dict[str, Any],
               steps: list[int], problems: list[ReadProblem],
               times: dict[int, float]) -> tuple[int, str | None]:
    """Fold one event file's scalars into ``rows`` (the steps it wrote into ``steps``, its JSON
    text summaries into ``texts`` by tag, an event whose step is not one into ``problems``);
    (events read, the damage if any)."""
    from tensorboard import data_compat
    from tensorboard.compat.proto import event_pb2
    from tensorboard.util import tensor_util

    events = 0
    with open_regular(path, MAX_EVENT_FILE_BYTES) as handle:
        size = handle.seek(0, 2)
        handle.seek(0)
        records = _records(handle, size)
        while True:
            try:
                record = next(records, None)
            except _Damage as exc:
                return events, f"damaged after {events} events ({exc})"
            if record is None:
                return events, None
            try:
                event = event_pb2.Event.FromString(record)
            except Exception as exc:  # a record that is not an Event: say so, go on
                return events, f"record {events + 1} is not a TensorBoard Event ({exc})"
            events += 1
            step = checked_step(int(event.step)) if event.summary.value else 0
            if isinstance(step, str):
                problems.append(ReadProblem(str(path), f"event {events}: 'step' {step}; "
                                            "its values are skipped"))
                continue
            for value in event.summary.value:
                migrated = data_compat.migrate_value(value)
                plugin = migrated.metadata.plugin_data.plugin_name
                if plugin == _TEXT:
                    _text(value.tag, tensor_util.make_ndarray(migrated.tensor), texts)
                    continue
                if plugin != _SCALARS:
                    continue
                array = tensor_util.make_ndarray(migrated.tensor)
                if array.size != 1:
                    continue
                rows[step][value.tag] = float(array.reshape(()).item())
                steps.append(step)
                times[step] = max(times.get(step, 0.0), float(event.wall_time))


def _text(tag: str, array: Any, texts: dict[str, Any]) -> None:
    """A text summary that is a JSON object (a config), kept by its tag."""
    if array.size != 1:
        return
    raw = array.reshape(()).item()
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    try:
        obj = bounded_json(text)
    except ValueError:  # not JSON, or nested too deeply: not a config
        return
    if isinstance(obj, dict):
        texts[tag] = obj


def read_tensorboard(directory: Path, files: list[Path] | None = None) -> LoggedRun:
    """The run whose event files lie directly in ``directory`` (or only ``files`` of it)."""
    files = event_files(directory) if files is None else files
    if not files:
        raise LogError(str(directory), "no TensorBoard event file (events.out.tfevents.*) here")
    rows: dict[int, dict[str, float]] = defaultdict(dict)
    problems: list[ReadProblem] = []
    times: dict[int, float] = {}  # the latest wall time of each step's scalars
    damages = []
    read = 0
    segments = []
    for path in files:
        texts: dict[str, Any] = {}
        steps: list[int] = []
        try:
            events, damage = _read_file(path, rows, texts, steps, problems, times)
        except InputFileError as exc:
            problems.append(ReadProblem(exc.path, exc.message))
            continue
        except OSError as exc:
            problems.append(ReadProblem(str(path), f"cannot read: {exc.strerror or exc}"))
            continue
        read += events
        config = {k: v for text in texts.values() for k, v in text.items()}
        settings = settings_from_config(config, f"{path.name} text {', '.join(texts)}")
        if (settings.known or settings.refused) and steps:
            segments.append(Segment(min(steps), settings, str(path), flatten(config)))
        if damage is not None:
            damages.append(f"{path.name}: {damage}")
            problems.append(ReadProblem(
                str(path), f"not a complete TensorBoard event file: {damage}; the events "
                "before it are diagnosed"))
    if not read:
        raise LogError(str(files[0] if len(files) == 1 else directory),
                       "expected TensorBoard event records, read none ("
                       + "; ".join(damages or [p.message for p in problems]
                                   or [f"{len(files)} empty event files"]) + ")")
    return LoggedRun(str(directory), "tensorboard", run_name(directory.name),
                     {step: dict(values) for step, values in sorted(rows.items())},
                     problems=tuple(problems),
                     segments=tuple(sorted(segments, key=lambda s: s.first_step)),
                     times=dict(sorted(times.items())))
