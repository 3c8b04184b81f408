"""Forwarding to TensorBoard event files, written with TensorBoard's own writer and protos.

One directory per tracker run under ``log_dir`` (TensorBoard lists each as a run). A value is a
scalar summary holding a float64 tensor (the scalars plugin's data class), so it is the exact
value, not the float32 of a legacy ``simple_value``. The settings, each alert transition
(``rlmon_alerts/<role>``, at its step) and the end state (``rlmon_end_state``) are text
summaries.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlmon.service.alerting.alert_types import AlertEvent
from rlmon.service.alerting.notify.render import summary_line
from rlmon.service.config import TensorBoardForward
from rlmon.service.forward.tracker import EndState, ForwardedStep, TrackerRun

__all__ = ["TensorBoardTracker"]


class TensorBoardTracker:
    name = "tensorboard"

    def __init__(self, config: TensorBoardForward) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, types_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self.config = config
        self._event, self._summary, self._tensor, self._types = (
            event_pb2, summary_pb2, tensor_pb2, types_pb2)
        self._writer_class = EventFileWriter
        self._scalar = summary_pb2.SummaryMetadata(
            plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"),
            data_class=summary_pb2.DATA_CLASS_SCALAR)
        self._text = summary_pb2.SummaryMetadata(
            plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="text"),
            data_class=summary_pb2.DATA_CLASS_TENSOR)
        self._writers: dict[TrackerRun, Any] = {}
        self._last_step: dict[TrackerRun, int] = {}

    def directory(self, run: TrackerRun) -> Path:
        return Path(self.config.log_dir) / run.id

    def _open(self, run: TrackerRun, settings: Mapping[str, str]) -> Any:
        writer = self._writers.get(run)
        if writer is None:
            path = self.directory(run)
            path.mkdir(parents=True, exist_ok=True)
            writer = self._writers[run] = self._writer_class(str(path))
            if settings:
                self._write_text(writer, "rlmon_settings", _table(settings), 0)
        return writer

    def _write(self, writer: Any, step: int, wall: float, values: list[Any]) -> None:
        writer.add_event(self._event.Event(wall_time=wall, step=step,
                                           summary=self._summary.Summary(value=values)))

    def _write_text(self, writer: Any, tag: str, text: str, step: int) -> None:
        tensor = self._tensor.TensorProto(dtype=self._types.DT_STRING,
                                          string_val=[text.encode()])
        self._write(writer, step, time.time(), [
            self._summary.Summary.Value(tag=tag, metadata=self._text, tensor=tensor)])

    def log(self, run: TrackerRun, settings: Mapping[str, str],
            steps: Sequence[ForwardedStep]) -> None:
        writer = self._open(run, settings)
        value, tensor, double = self._summary.Summary.Value, self._tensor.TensorProto, \
            self._types.DT_DOUBLE
        for step in steps:
            self._write(writer, step.step, step.time, [
                value(tag=key, metadata=self._scalar, tensor=tensor(dtype=double, double_val=[v]))
                for key, v in step.values.items()])
            self._last_step[run] = max(self._last_step.get(run, step.step), step.step)
        writer.flush()

    def alerts(self, run: TrackerRun, settings: Mapping[str, str],
               events: Sequence[AlertEvent]) -> None:
        writer = self._open(run, settings)
        for event in events:
            self._write_text(writer, f"rlmon_alerts/{event.role}", summary_line(event),
                             event.step)
        writer.flush()

    def settings(self, run: TrackerRun, settings: Mapping[str, str]) -> None:
        writer = self._open(run, {})
        self._write_text(writer, "rlmon_settings", _table(settings), 0)
        writer.flush()

    def end(self, run: TrackerRun, state: EndState) -> None:
        writer = self._open(run, {})
        self._write_text(writer, "rlmon_end_state", state, self._last_step.get(run, 0))
        self.release(run)

    def release(self, run: TrackerRun) -> None:
        writer = self._writers.pop(run, None)
        self._last_step.pop(run, None)
        if writer is not None:
            writer.close()


def _table(settings: Mapping[str, str]) -> str:
    """The settings as a Markdown table (TensorBoard's text plugin renders it)."""
    rows = "\n".join(f"| {k} | {v} |" for k, v in sorted(settings.items()))
    return f"| setting | value |\n|---|---|\n{rows}"
