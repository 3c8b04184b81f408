"""Two runs' metrics as per-step series under one set of names, and the settings they carry.

A run comes from any log ``rlmon diagnose`` reads (TensorBoard, W&B, ``trainer_state.json``,
verl's file logger, rlmon's own files) or from the history store by name. Keys are mapped to the
catalog's names with the framework key maps, so a TensorBoard ``train/kl`` and a trainer state's
``kl`` are one metric; a key the maps do not know is kept under its logged name (without a
tracker's ``train/`` prefix); step counters and runtimes are left out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlmon.service.diagnose.columns import ColumnRows
from rlmon.service.diagnose.logged_run import LoggedRun
from rlmon.service.diagnose.mapping import KeyStatus, map_keys, rlmon_key_map
from rlmon.service.metrics.nonfinite import NONFINITE_VALUES

__all__ = ["RunSeries", "from_logged", "from_step_lines", "setting_differences"]

# config keys that differ between any two runs by nature (where they are written, their name,
# the tracker's own bookkeeping): never reported as a difference of settings
_PER_RUN = ("output_dir", "logging_dir", "run_name", "hub_model_id", "hub_token", "_wandb",
            "wandb_version", "run_id", "project_dir")


@dataclass(frozen=True, slots=True)
class RunSeries:
    """One run's values: ``series[name]`` is ``{step: value}`` (NaN and Inf kept)."""

    label: str  # as given on the command line
    name: str
    source: str
    format: str
    series: Mapping[str, Mapping[int, float]]
    keys: Mapping[str, str] = field(default_factory=dict)  # name -> the key as logged
    config: Mapping[str, Any] = field(default_factory=dict)  # flattened, as recorded
    framework: str | None = None

    @property
    def steps(self) -> int:
        return len({s for values in self.series.values() for s in values})

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "run": self.name, "source": self.source,
                "format": self.format, "framework": self.framework, "steps": self.steps,
                "metrics": len(self.series)}


def _rows(run: LoggedRun) -> Iterable[tuple[int, Mapping[str, float]]]:
    if isinstance(run.rows, ColumnRows):
        return run.rows.rows()
    return run.rows.items()


def from_logged(run: LoggedRun, label: str) -> RunSeries:
    """A read log's series under the mapped names."""
    config: dict[str, Any] = {}
    for segment in run.segments:  # the last process's values win, as in a resumed run
        config.update(segment.config)
    if run.records:
        keymap = rlmon_key_map(run.keys)
        series: dict[str, dict[int, float]] = {}
        for record in run.records:
            for name, value in record.metrics.items():
                series.setdefault(name, {}).setdefault(record.step, value)
        return RunSeries(label, run.name, run.source, run.format, series,
                         {n: n for n in series}, config, keymap.framework)
    keymap = map_keys(run.keys, None, run.framework)
    names: dict[str, str] = {}
    for info in keymap.keys:
        if info.status is KeyStatus.BOOKKEEPING:
            continue
        names[info.key] = info.name if info.status is KeyStatus.CANONICAL and info.name \
            else info.key.removeprefix("train/")
    series = {}
    for step, values in _rows(run):
        for key, value in values.items():
            mapped = names.get(key)
            if mapped is not None:
                series.setdefault(mapped, {})[step] = value
    return RunSeries(label, run.name, run.source, run.format, series,
                     {name: key for key, name in names.items()}, config, keymap.framework)


def from_step_lines(lines: Sequence[Mapping[str, Any]], label: str, source: str) -> RunSeries:
    """A stored run's step lines (``HistoryStore.steps``: every role, every attempt; a later
    attempt's step replaces an earlier one's)."""
    series: dict[str, dict[int, float]] = {}
    nonfinite = NONFINITE_VALUES
    name = label
    for line in lines:
        name = str(line.get("run", label))
        step = int(line["step"])
        metrics = {k: float(v) for k, v in line.get("metrics", {}).items() if v is not None}
        metrics.update({k: nonfinite[v] for k, v in line.get("nonfinite", {}).items()
                        if v in nonfinite})
        for metric, value in metrics.items():
            series.setdefault(metric, {})[step] = value
    return RunSeries(label, name, source, "rlmon-history", series, {n: n for n in series})


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


def _per_run(key: str) -> bool:
    last = key.rsplit(".", 1)[-1]
    return key.startswith("_") or last in _PER_RUN or key.split(".", 1)[0] in _PER_RUN \
        or last.endswith("_dir")


def setting_differences(a: Mapping[str, Any], b: Mapping[str, Any]
                        ) -> list[tuple[str, Any, Any]]:
    """(key, a's value, b's value) of every recorded setting that differs, where both runs
    recorded settings (a key only one run has is a difference too, with None for the other)."""
    if not a or not b:
        return []
    out = []
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key), b.get(key)
        if _per_run(key) or not (_scalar(va) and _scalar(vb)) or va == vb:
            continue
        out.append((key, va, vb))
    return out
