"""What every integration shares: the Reporter seam and relaying a framework's logged dict."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np

from rlmon.actors.reporter.sink import JsonlSink
from rlmon.actors.reporter.tensor_stats import is_torch
from rlmon.service.metrics import catalog, keymaps
from rlmon.service.metrics.forms import FORMS

__all__ = ["ReporterLike", "as_float64", "end_training", "make_reporter", "plan_steps",
           "record_mismatch_samples", "relay", "scalar", "send_run_info"]


class ReporterLike(Protocol):
    """The part of :class:`rlmon.actors.reporter.Reporter` the integrations use."""

    def record(self, name: str, **stat: Any) -> None: ...

    def record_tensor(self, name: str, values: Any, mask: Any = None, **kw: Any) -> None: ...

    def record_sample_tensor(self, name: str, values: Any, mask: Any = None, **kw: Any,
                             ) -> None: ...

    def end_micro_batch(self) -> None: ...

    def end_step(self, step: int) -> None: ...

    def flush(self, timeout: float | None = None) -> bool: ...

    def close(self) -> None: ...


def plan_steps(reporter: Any, total: Any) -> int | None:
    """Tell the Reporter the run's planned number of steps, as the framework says it (TRL's
    ``max_steps``, OpenRLHF's ``get_max_steps()``, verl's ``total_training_steps``): once the
    last ended, a final save or evaluation is not a stall (docs/liveness.md). A value the
    framework left unset (None, 0, -1) is not said."""
    total = scalar(total)
    setter = getattr(reporter, "set_total_steps", None)
    if total is None or total < 1 or not float(total).is_integer() or not callable(setter):
        return None
    setter(int(total))
    return int(total)


def end_training(*reporters: ReporterLike | None, timeout: float = 10.0) -> None:
    """The framework's end of training: flush and close each Reporter, so each rank says it
    ended cleanly (a crash in flight is said as the crash: ``close`` sees it)."""
    for reporter in reporters:
        if reporter is not None:
            reporter.flush(timeout)
            reporter.close()


def as_float64(x: Any) -> np.ndarray:
    """A torch tensor (any device) or array-like as a float64 numpy array on the host: no
    precision lost to float32 in the statistics computed from it."""
    if is_torch(x):
        x = x.detach().double().cpu().numpy()
    return np.asarray(x, dtype=np.float64)


def record_mismatch_samples(reporter: ReporterLike, log_ratio: Any, mask: Any, *, k: int = 8,
                            ids: Any = None, payload: Any = None, worst_mean: bool = True,
                            ) -> None:
    """The worst sequences of a batch by trainer/rollout mismatch, from the per-token
    ``log_ratio`` = logp_trainer_old - logp_rollout (a torch tensor stays on its device): the
    largest mean abs(log_ratio) per sequence (``worst_mean``; leave it out where a sequence's
    tokens are split over ranks) and the smallest token IS ratio exp(log_ratio) per sequence (a
    split sequence's shards share its id, so the merge keeps its smallest)."""
    exp = log_ratio.exp() if hasattr(log_ratio, "exp") else np.exp(np.asarray(log_ratio, float))
    if worst_mean:
        reporter.record_sample_tensor(catalog.LOGP_DIFF_WORST, abs(log_ratio), mask,
                                      score="mean", k=k, ids=ids, payload=payload)
    reporter.record_sample_tensor(catalog.IS_RATIO_LOWEST, exp, mask, score="min", k=k,
                                  ids=ids, payload=payload)


def lazy_class(module: str, name: str, build: Callable[[], type]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that builds class ``name`` on first use, so that importing the
    integration does not import its framework (the class subclasses one of the framework's)."""
    built: list[type] = []

    def __getattr__(attr: str) -> Any:
        if attr != name:
            raise AttributeError(f"module {module!r} has no attribute {attr!r}")
        if not built:
            built.append(build())
        return built[0]

    return __getattr__


def send_run_info(reporter: Any, **fields: Any) -> dict[str, Any]:
    """Send what an integration knows of the run (fields of ``rlmon.service.contract.run_info.RunInfo``:
    framework, framework_version, algorithm, loss_reduction, dp, cp, tp, pp, grad_accumulation,
    zero_stage, deepspeed_version, dpo) through ``Reporter.set_run_info``; unknown values (None)
    are left out. Returns what was sent. Best effort: a reporter without it sends nothing."""
    known = {k: v for k, v in fields.items() if v is not None}
    hook = getattr(reporter, "set_run_info", None)
    if callable(hook):
        hook(**known)
    return known


def framework_version(module: str) -> str | None:
    """The installed version of a framework package (None when it is not installed)."""
    from importlib import metadata

    try:
        return metadata.version(module)
    except metadata.PackageNotFoundError:
        return None


def make_reporter(run: str, role: str, **kw: Any) -> Any:
    """A real Reporter (imported here so that the integration modules import without Ray)."""
    from rlmon.actors.reporter import Reporter

    return Reporter(run, role, **kw)


def scalar(value: Any) -> float | None:
    """A plain float from a Python number, numpy scalar or one-element tensor; None otherwise."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        return float(value)
    item = getattr(value, "item", None)
    shape = getattr(value, "shape", None)
    if callable(item) and shape is not None and tuple(shape) in ((), (1,)):
        try:
            return float(item())
        except (TypeError, ValueError):
            return None
    return None


def _record_as(reporter: ReporterLike, name: str, value: float) -> None:
    """Record an already-reduced value under a canonical name in that name's form (as a value
    where the form cannot hold one)."""
    spec = FORMS[catalog.get(name).forms[0]]
    if spec.of_value is None:
        reporter.record(name, value=value)
    else:
        reporter.record(name, **spec.as_keys(spec.of_value(value)))


def relay(
    reporter: ReporterLike,
    framework: str,
    logs: Mapping[str, Any],
    *,
    prefix: str = "",
) -> dict[str, str]:
    """Record a framework's already-reduced dict; returns {framework key: published name}.

    Keys whose framework reduction is comparable go under their canonical name; every other
    numeric key goes under ``<framework>/<prefix><key>`` as a value. Non-numbers are skipped.
    """
    published: dict[str, str] = {}
    canon_used: set[str] = set()
    for key, raw in logs.items():
        value = scalar(raw)
        if value is None:
            continue
        name = keymaps.canonical(framework, key) if not prefix else None
        if name is not None and name not in canon_used:
            canon_used.add(name)
            _record_as(reporter, name, value)
        else:
            name = keymaps.relay_name(framework, prefix + key)
            reporter.record(name, value=value)
        published[key] = name
    return published


def env_reporter(run: str, role: str, **kw: Any) -> ReporterLike:
    """A Reporter for a process configured by environment (plugins): ``RLMON_SINK_JSONL`` picks
    a file sink, otherwise the Ray aggregator of ``RLMON_NAMESPACE`` (default ``rlmon``)."""
    import os

    path = os.environ.get("RLMON_SINK_JSONL")
    if path:
        kw.setdefault("sink", JsonlSink(path))
    kw.setdefault("namespace", os.environ.get("RLMON_NAMESPACE", "rlmon"))
    return make_reporter(run, role, **kw)
