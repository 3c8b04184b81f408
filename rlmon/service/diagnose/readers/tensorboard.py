"""TensorBoard event files, read with TensorBoard's own record reader and event protos.

Every directory holding ``events.out.tfevents.*`` files is one run (TensorBoard's own notion of
a run); its files are read in name order (the writer's start time) and a later file's value for
a (step, tag) replaces an earlier one, as after a restart. Scalars written either way are read:
``simple_value`` (torch.utils.tensorboard, the Hugging Face callback) and scalar tensors
(``tensorboard.summary``), both through :func:`tensorboard.data_compat.migrate_value`. A
truncated or corrupt file keeps the events before the damage and is reported.

Each file is a segment of the run (one process's writing): a text summary holding a JSON
object (the Hugging Face callback writes its ``TrainingArguments`` so, under ``args``) gives the
settings that file was written with.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from rlmon.service.diagnose.logged_run import LogError, LoggedRun, ReadProblem, run_name
from rlmon.service.diagnose.run_settings import Segment, settings_from_config

__all__ = ["EVENT_FILE_MARK", "event_files", "read_tensorboard"]

EVENT_FILE_MARK = "tfevents"
_SCALARS = "scalars"
_TEXT = "text"


def event_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.is_file() and EVENT_FILE_MARK in p.name)


def _read_file(path: Path, rows: dict[int, dict[str, float]],
               texts: dict[str, Any] | None = None,
               steps: list[int] | None = None) -> tuple[int, str | None]:
    """Fold one event file's scalars into ``rows`` (the steps it wrote into ``steps``, its JSON
    text summaries into ``texts`` by tag); (events read, the damage if any)."""
    from tensorboard import data_compat
    from tensorboard.compat.proto import event_pb2
    from tensorboard.compat.tensorflow_stub import errors, pywrap_tensorflow
    from tensorboard.util import tensor_util

    reader = pywrap_tensorflow.PyRecordReader_New(str(path).encode(), 0, b"", None)
    events = 0
    while True:
        try:
            reader.GetNext()
        except errors.OutOfRangeError:
            return events, None
        except errors.DataLossError as exc:
            text = str(exc).replace(repr(str(path).encode()), "").strip()
            return events, f"damaged after {events} events ({text})"
        try:
            event = event_pb2.Event.FromString(reader.record())
        except Exception as exc:  # a record that is not an Event: say so, go on
            return events, f"record {events + 1} is not a TensorBoard Event ({exc})"
        events += 1
        for value in event.summary.value:
            migrated = data_compat.migrate_value(value)
            plugin = migrated.metadata.plugin_data.plugin_name
            if plugin == _TEXT and texts is not None:
                _text(value.tag, tensor_util.make_ndarray(migrated.tensor), texts)
                continue
            if plugin != _SCALARS:
                continue
            array = tensor_util.make_ndarray(migrated.tensor)
            if array.size != 1:
                continue
            rows[int(event.step)][value.tag] = float(array.reshape(()).item())
            if steps is not None:
                steps.append(int(event.step))


def _text(tag: str, array: Any, texts: dict[str, Any]) -> None:
    """A text summary that is a JSON object (a config), kept by its tag."""
    if array.size != 1:
        return
    raw = array.reshape(()).item()
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    try:
        obj = json.loads(text)
    except ValueError:
        return
    if isinstance(obj, dict):
        texts[tag] = obj


def read_tensorboard(directory: Path, files: list[Path] | None = None) -> LoggedRun:
    """The run whose event files lie directly in ``directory`` (or only ``files`` of it)."""
    files = event_files(directory) if files is None else files
    if not files:
        raise LogError(str(directory), "no TensorBoard event file (events.out.tfevents.*) here")
    rows: dict[int, dict[str, float]] = defaultdict(dict)
    problems = []
    damages = []
    read = 0
    segments = []
    for path in files:
        texts: dict[str, Any] = {}
        steps: list[int] = []
        try:
            events, damage = _read_file(path, rows, texts, steps)
        except OSError as exc:
            problems.append(ReadProblem(str(path), f"cannot read: {exc.strerror or exc}"))
            continue
        read += events
        config = {k: v for text in texts.values() for k, v in text.items()}
        settings = settings_from_config(config, f"{path.name} text {', '.join(texts)}")
        if settings.known and steps:
            segments.append(Segment(min(steps), settings, str(path)))
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
                     segments=tuple(sorted(segments, key=lambda s: s.first_step)))
