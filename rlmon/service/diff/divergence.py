"""Where two runs part ways: the first step their metrics differ beyond their own noise.

Two seeds of one config never log the same numbers: each step samples a fresh batch, and each
run's policy wanders its own way. So a difference counts only when it is larger than what the
two runs' own noise makes, and stays so:

- **Noise**, per run and metric: the step-to-step noise, 1.4826 x the median absolute deviation
  of the first differences over sqrt(2) (robust to a trend and to spikes); and the slow wander
  (what two seeds drift apart by without anything having changed: the policy's own, which the
  step-to-step noise does not show), from the second differences at a lag of 20 steps (a linear
  trend drops out), less the step noise's share. A metric spanning more than a factor
  of 20 (a KL, a gradient norm) is compared on a log scale.
- **Difference**: the trailing ``smooth``-step medians of the two runs, subtracted, at each
  common step; its scale is the combined noise of that difference (the median of ``smooth``
  values has 1.2533 / sqrt(smooth) of one value's noise) and the two wanders.
- **Departure**: the difference is over ``z`` scales, raised for the number of metrics compared
  (``sqrt(z^2 + 2 ln M)``, a Gaussian tail's union bound, so many metrics do not make a false
  alarm more likely), with one sign, for ``persist`` steps in a row. The step reported is the
  first of those steps; the first diverging metric is the one whose departure began first
  (the larger departure, in its own noise, breaks a tie), so it is never simply the noisiest.
- A metric without noise in either run (a learning-rate schedule, a constant) is compared
  exactly: where it differs it is a setting or a schedule, reported apart.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from rlmon.service.contract.step_record import json_number
from rlmon.service.diff.runs import RunSeries, setting_differences

__all__ = ["DiffParams", "DiffResult", "MetricDivergence", "diff_runs"]

_MAD_TO_SD = 1.4826
_MEDIAN_EFFICIENCY = 1.2533  # a median's noise over a mean's, for Gaussian values
_LAG = 20  # steps: the wander's lag
_LOG_SPAN = 20.0  # a positive metric spanning more than this factor is compared in logs
_CURVE_POINTS = 400  # per run and metric, for the page
_SMOOTH = 0.1  # second over first differences below this: no noise
_SHARED_START = 5  # steps logged identically by both runs: a deterministic series


@dataclass(frozen=True, slots=True)
class DiffParams:
    """The test's parameters (tuned on ``bench/bench_diff.py``)."""

    smooth: int = 7  # steps in the trailing median
    z: float = 2.5  # scales of the difference's noise, before the many-metrics raise
    persist: int = 10  # consecutive steps the departure must hold
    min_steps: int = 12  # common steps a metric needs to be compared
    relative_floor: float = 0.01  # the scale is at least this share of the metric's level


@dataclass(frozen=True, slots=True)
class MetricDivergence:
    """One metric compared over the two runs' common steps."""

    metric: str
    key_a: str
    key_b: str
    steps: int  # common finite steps compared
    scale: str  # linear | log
    noise_a: float  # step-to-step noise, in the scale's units
    noise_b: float
    wander_a: float
    wander_b: float
    threshold: float  # the departure's bar on the smoothed difference, in the scale's units
    onset: int | None = None  # first step of the departure (None: never)
    a_value: float | None = None  # the smoothed values at the departure's last persisted step
    b_value: float | None = None
    score: float = 0.0  # |difference| / threshold there
    exact: bool = False  # compared value for value (no noise, or logged alike at first)
    shared_start: bool = False  # noisy, but logged identically at first (same seed and data)

    @property
    def diverged(self) -> bool:
        return self.onset is not None

    def describe(self) -> str:
        name = self.metric if self.key_a in ("", self.metric) else f"{self.metric} ({self.key_a})"
        if not self.diverged:
            return f"{name}: within noise over {self.steps} steps"
        if self.shared_start:
            return f"{name}: logged identically until step {self.onset} (the same seed and " \
                   f"data), then differs ({_fmt(self.a_value)} vs {_fmt(self.b_value)})"
        if self.exact:
            return f"{name}: differs from step {self.onset} ({_fmt(self.a_value)} vs " \
                   f"{_fmt(self.b_value)}; no noise in either run: a setting or a schedule)"
        return (f"{name}: parts at step {self.onset} ({_fmt(self.a_value)} vs "
                f"{_fmt(self.b_value)}, {self.score:.1f}x the bar; noise "
                f"{_fmt(self.noise_a)} / {_fmt(self.noise_b)}{' (log)' if self.scale == 'log' else ''})")

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        for name in ("noise_a", "noise_b", "wander_a", "wander_b", "threshold", "a_value",
                     "b_value", "score"):
            out[name] = json_number(out[name])
        out["diverged"] = self.diverged
        return out


@dataclass(frozen=True, slots=True)
class DiffResult:
    """Two runs compared: JSON-able (:meth:`to_json`) for ``--json`` and a page view."""

    a: RunSeries
    b: RunSeries
    params: DiffParams
    common_steps: int
    metrics: tuple[MetricDivergence, ...]  # diverged first (by onset), then the rest
    settings: tuple[tuple[str, Any, Any], ...] = ()  # (key, a, b) recorded and different
    only_a: tuple[str, ...] = ()
    only_b: tuple[str, ...] = ()
    curves: Mapping[str, tuple[Sequence[tuple[int, float]], Sequence[tuple[int, float]]]] = \
        field(default_factory=dict)

    @property
    def first(self) -> MetricDivergence | None:
        """The first metric with noise to part ways (a schedule that differs is a setting; a
        metric both runs logged identically at first parts where it first differs)."""
        return next((m for m in self.metrics if m.diverged
                     and (not m.exact or m.shared_start)), None)

    @property
    def exact_differences(self) -> list[MetricDivergence]:
        """Schedules and constants that differ (no noise in either run)."""
        return [m for m in self.metrics if m.diverged and m.exact and not m.shared_start]

    @property
    def diverged(self) -> bool:
        return self.first is not None

    def headline(self) -> str:
        first = self.first
        if first is not None:
            return (f"runs part ways at step {first.onset} (first diverging metric: "
                    f"{first.metric})")
        compared = sum(not m.exact for m in self.metrics)
        return (f"no divergence beyond the runs' own noise over {self.common_steps} common "
                f"steps ({compared} metrics compared)")

    def to_json(self) -> dict[str, Any]:
        first = self.first
        return {
            "type": "diff", "a": self.a.to_json(), "b": self.b.to_json(),
            "diverged": self.diverged, "step": first.onset if first else None,
            "metric": first.metric if first else None, "headline": self.headline(),
            "common_steps": self.common_steps,
            "settings": [{"key": k, "a": _json_value(va), "b": _json_value(vb)}
                         for k, va, vb in self.settings],
            "metrics": [m.to_json() for m in self.metrics],
            "only_a": list(self.only_a), "only_b": list(self.only_b),
            "params": asdict(self.params),
            "curves": {name: {"a": [[s, json_number(v)] for s, v in ca],
                              "b": [[s, json_number(v)] for s, v in cb]}
                       for name, (ca, cb) in self.curves.items()},
        }


def _json_value(value: Any) -> Any:
    return json_number(value) if isinstance(value, float) else value


def _fmt(value: float | None) -> str:
    if value is None:
        return "n/a"
    if value != value:
        return "NaN"
    return f"{value:.4g}"


def _trailing_median(x: np.ndarray, width: int) -> np.ndarray:
    """The median of each value and the ``width - 1`` before it (fewer at the start)."""
    out = np.empty_like(x)
    head = min(width - 1, len(x))
    for i in range(head):
        out[i] = np.median(x[:i + 1])
    if len(x) >= width:
        out[width - 1:] = np.median(np.lib.stride_tricks.sliding_window_view(x, width), axis=1)
    return out


def _mad(x: np.ndarray) -> float:
    if len(x) == 0:
        return 0.0
    return float(_MAD_TO_SD * np.median(np.abs(x - np.median(x))))


def _noise(x: np.ndarray) -> float:
    """The step-to-step noise from first differences (a slow trend barely moves them)."""
    return _mad(np.diff(x)) / math.sqrt(2) if len(x) > 2 else 0.0


def _no_noise(x: np.ndarray) -> bool:
    """Whether a series has no sampling noise (a schedule, a constant, a counter): its second
    differences far below its first (noise makes them larger, by sqrt(3))."""
    if len(x) < 4:
        return False
    first = float(np.median(np.abs(np.diff(x))))
    second = float(np.median(np.abs(np.diff(x, 2))))
    return second <= _SMOOTH * first or (first == 0 and second == 0)


def _wander(x: np.ndarray) -> float:
    """The slow wander: x[t + 2L] - 2 x[t + L] + x[t] has 6 times the variance of what moves
    x over L steps (noise and wander), a linear trend dropping out; the noise's share is
    taken out."""
    lag = min(_LAG, len(x) // 3)
    if lag < 2:
        return 0.0
    total = _mad(x[2 * lag:] - 2 * x[lag:-lag] + x[:-2 * lag]) / math.sqrt(6)
    return math.sqrt(max(0.0, total ** 2 - _noise(x) ** 2))


def _curve(series: Mapping[int, float]) -> list[tuple[int, float]]:
    items = sorted(series.items())
    if len(items) > _CURVE_POINTS:
        stride = math.ceil(len(items) / _CURVE_POINTS)
        items = items[::stride] + ([items[-1]] if (len(items) - 1) % stride else [])
    return items


def _compare(metric: str, a: RunSeries, b: RunSeries, p: DiffParams, z: float
             ) -> MetricDivergence | None:
    sa, sb = a.series[metric], b.series[metric]
    steps = sorted(s for s in set(sa) & set(sb)
                   if math.isfinite(sa[s]) and math.isfinite(sb[s]))
    if len(steps) < p.min_steps:
        return None
    xa = np.array([sa[s] for s in steps], dtype=float)
    xb = np.array([sb[s] for s in steps], dtype=float)
    both = np.concatenate([xa, xb])
    smooth = _no_noise(xa) and _no_noise(xb)
    scale = "linear"
    if both.min() > 0 and both.max() / both.min() > _LOG_SPAN:
        scale, xa, xb = "log", np.log(xa), np.log(xb)
    keys = (a.keys.get(metric, metric), b.keys.get(metric, metric))
    na, nb = _noise(xa), _noise(xb)
    level = float(np.median(np.abs(both))) if scale == "linear" else 0.0
    # float32 (TensorBoard) against float64 (JSON) of one value: equal to 1e-6
    differs = ~np.isclose(xa, xb, rtol=1e-6, atol=1e-12 * max(level, 1e-300))
    shared = min(_SHARED_START, len(steps))
    if smooth or not differs[:shared].any():
        # a schedule or a constant (no noise), or a series both runs computed alike from the
        # start (two noisy runs never log the same floats): compared value for value
        at = int(np.argmax(differs)) if differs.any() else None
        return MetricDivergence(
            metric, keys[0], keys[1], len(steps), scale, 0.0, 0.0, 0.0, 0.0, 0.0,
            onset=steps[at] if at is not None else None,
            a_value=float(sa[steps[at]]) if at is not None else None,
            b_value=float(sb[steps[at]]) if at is not None else None,
            score=math.inf if at is not None else 0.0, exact=True,
            shared_start=not smooth)
    width = min(p.smooth, len(steps))
    ma, mb = _trailing_median(xa, width), _trailing_median(xb, width)
    wa, wb = _wander(xa), _wander(xb)
    spread = _MEDIAN_EFFICIENCY / math.sqrt(width)
    # a run that parts ways inflates its own wander (its new trend looks like some): slower
    # to call, never quicker; the quieter run's alone came out near 0 by chance too often
    sd = math.sqrt(spread ** 2 * (na ** 2 + nb ** 2) + wa ** 2 + wb ** 2)
    threshold = z * max(sd, p.relative_floor * level, 1e-12)
    diff = ma - mb
    over = np.abs(diff) > threshold
    sign = np.sign(diff)
    onset = None
    run = 0
    for i in range(width - 1, len(steps)):  # judged once the medians hold `smooth` steps
        run = run + 1 if over[i] and (run == 0 or sign[i] == sign[i - 1]) else int(over[i])
        if run >= p.persist:
            onset = i - run + 1
            break
    if onset is None:
        return MetricDivergence(metric, *keys, len(steps), scale, na, nb, wa, wb, threshold)
    end = onset + p.persist - 1
    back = math.exp if scale == "log" else float
    return MetricDivergence(metric, *keys, len(steps), scale, na, nb, wa, wb, threshold,
                            steps[onset], back(float(ma[end])), back(float(mb[end])),
                            float(abs(diff[end]) / threshold))


def diff_runs(a: RunSeries, b: RunSeries, params: DiffParams | None = None) -> DiffResult:
    """Compare every metric both runs logged; see the module's docstring for the test."""
    p = params or DiffParams()
    shared = [m for m in a.series if m in b.series]
    # the union bound over the metrics and over the run's stretches of `persist` steps: a
    # longer run, or more metrics, are more chances for the noise alone to look like a parting
    steps = len({s for m in shared for s in a.series[m]})
    z = math.sqrt(p.z ** 2 + 2 * math.log(max(len(shared) * steps / p.persist, 1)))
    compared = [d for d in (_compare(m, a, b, p, z) for m in shared) if d is not None]
    compared.sort(key=lambda d: (not d.diverged, d.onset if d.onset is not None else 0,
                                 -d.score, d.metric))
    common = len({s for m in shared for s in a.series[m]} & {s for m in shared
                                                             for s in b.series[m]})
    shown = [d.metric for d in compared if d.diverged][:6] or [d.metric for d in compared][:2]
    curves = {m: (_curve(a.series[m]), _curve(b.series[m])) for m in shown}
    return DiffResult(a, b, p, common, tuple(compared),
                      tuple(setting_differences(a.config, b.config)),
                      tuple(m for m in a.series if m not in b.series),
                      tuple(m for m in b.series if m not in a.series), curves)
