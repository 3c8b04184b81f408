"""Where two runs part ways: the first step their metrics differ beyond their own noise.

Two seeds of one config never log the same numbers: each step samples a fresh batch, and each
run's policy wanders its own way. So a difference counts only when it is larger than what the
two runs' own noise makes, and stays so:

- **Noise**, per run and metric, from the steps *before* the ones judged (the agreeing prefix,
  never a window that holds the departure: a run's own blow-up must not raise its bar): the
  step-to-step noise, 1.4826 x the median absolute deviation of the first differences over
  sqrt(2) (robust to a trend and to spikes; their root mean square for a discrete series that
  rarely moves); and the slow wander (what two seeds drift apart by without anything having
  changed: the policy's own, which the step-to-step noise does not show), from the second
  differences at a lag of up to 20 steps (a linear trend drops out), less the step noise's
  share. The prefix grows with the run (it ends at 24 steps and then every quarter more) and is
  frozen while a departure is being followed. A metric spanning more than a factor of 20 (a KL,
  a gradient norm) is compared on a log scale.
- **Non-finite values are data**: a metric one run logs as NaN or Inf where the other logs a
  number (or another non-finite value) parts at the first such step.
- **Precision**: two values closer than the formats hold them (float32 in TensorBoard, a value
  rounded to a few decimals by a logger) are the same number.
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
- Host and hardware telemetry (``perf/``, ``timing/``, a tracker's ``system/`` series) differ
  between machines, not between trainings: compared and listed apart, never the headline.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
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
_FIRST_REFERENCE = 24  # steps: the first noise reference (then every quarter more)
_FLOAT32_EPS = 2.0 ** -23
_DECIMALS = 10  # a logger's rounding looked for, up to this many decimals
# host and hardware telemetry: the machine's, not the training's (matched on the name's start)
_TELEMETRY_PREFIXES = ("perf/", "timing/", "timing_s/", "timing_per_token_ms/", "system/",
                       "system.", "hardware/", "sys/", "gpu/")


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
    nonfinite: str = ""  # "B" / "A" / "both": which run logged NaN or Inf where they part
    telemetry: bool = False  # host or hardware telemetry: a machine's, never the headline
    discrete: bool = False  # a series that moves rarely, in steps (compared against its noise)
    # the step ``a_value`` and ``b_value`` are from, where not the onset: the departure's last
    # persisted step, where the test confirmed it (the change point it dates lies before)
    value_step: int | None = None

    @property
    def diverged(self) -> bool:
        return self.onset is not None

    def describe(self) -> str:
        name = self.metric if self.key_a in ("", self.metric) else f"{self.metric} ({self.key_a})"
        if not self.diverged:
            how = "the same numbers in both runs" if self.exact else "within noise"
            return f"{name}: {how} over {self.steps} steps"
        if self.nonfinite:
            odd = self.b_value if self.nonfinite == "B" else self.a_value
            other = self.a_value if self.nonfinite == "B" else self.b_value
            other_run = "A" if self.nonfinite == "B" else "B"
            if self.nonfinite == "both":
                return (f"{name}: non-finite in both runs from step {self.onset}, but not "
                        f"alike ({_fmt(self.a_value)} vs {_fmt(self.b_value)})")
            return (f"{name}: {_fmt(odd)} in {self.nonfinite} from step {self.onset} "
                    f"({other_run} {_fmt(other)})")
        at = f"at step {self.value_step}: " if self.value_step not in (None, self.onset) else ""
        if self.telemetry:
            return (f"{name}: differs from step {self.onset} ({at}{_fmt(self.a_value)} vs "
                    f"{_fmt(self.b_value)}; host or hardware telemetry: the machines differ, "
                    "not the training)")
        if self.shared_start:
            return f"{name}: logged identically until step {self.onset} (the same seed and " \
                   f"data), then differs ({_fmt(self.a_value)} vs {_fmt(self.b_value)})"
        if self.exact:
            return f"{name}: differs from step {self.onset} ({_fmt(self.a_value)} vs " \
                   f"{_fmt(self.b_value)}; no noise in either run: a setting or a schedule)"
        if self.discrete:
            return (f"{name}: parts at step {self.onset} ({at}{_fmt(self.a_value)} vs "
                    f"{_fmt(self.b_value)}, {self.score:.1f}x the bar; a series that moves "
                    "rarely, in steps)")
        return (f"{name}: parts at step {self.onset} ({at}{_fmt(self.a_value)} vs "
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
        return next((m for m in self.parted), None)

    @property
    def parted(self) -> list[MetricDivergence]:
        """The training metrics that part ways, earliest first (not schedules, not telemetry)."""
        return [m for m in self.metrics if m.diverged and not m.telemetry
                and (not m.exact or m.shared_start or m.nonfinite)]

    @property
    def exact_differences(self) -> list[MetricDivergence]:
        """Schedules and constants that differ (no noise in either run)."""
        return [m for m in self.metrics if m.diverged and m.exact and not m.shared_start
                and not m.telemetry and not m.nonfinite]

    @property
    def telemetry(self) -> list[MetricDivergence]:
        """Host and hardware series compared: the machines', listed apart."""
        return [m for m in self.metrics if m.telemetry]

    @property
    def diverged(self) -> bool:
        return self.first is not None

    def headline(self) -> str:
        first = self.first
        if first is not None:
            return (f"runs part ways at step {first.onset} (first diverging metric: "
                    f"{first.metric})")
        training = sum(not m.telemetry for m in self.metrics)
        return (f"no divergence beyond the runs' own noise over {self.common_steps} common "
                f"steps ({training} metrics compared)")

    def compared(self) -> str:
        """How the training metrics were compared, and the telemetry kept apart."""
        training = [m for m in self.metrics if not m.telemetry]
        noisy = sum(not m.exact for m in training)
        text = f"{len(training)} metrics compared: {noisy} against their noise, " \
               f"{len(training) - noisy} value for value"
        machine = len(self.metrics) - len(training)
        return text + (f"; {machine} host and hardware series apart" if machine else "")

    def to_json(self) -> dict[str, Any]:
        first = self.first
        return {
            "type": "diff", "a": self.a.to_json(), "b": self.b.to_json(),
            "diverged": self.diverged, "step": first.onset if first else None,
            "metric": first.metric if first else None, "headline": self.headline(),
            "common_steps": self.common_steps, "compared": self.compared(),
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
    if not math.isfinite(value):
        return _kind(value)
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
    """The step-to-step noise from first differences (a slow trend barely moves them); for a
    series that moves in rare steps (their median 0) the root mean square of the steps."""
    if len(x) <= 2:
        return 0.0
    steps = np.diff(x)
    robust = _mad(steps)
    if robust == 0:
        return float(np.sqrt(np.mean(steps ** 2))) / math.sqrt(2)
    return robust / math.sqrt(2)


def _constant(x: np.ndarray) -> bool:
    return len(x) > 0 and bool(np.all(x == x[0]))


def _no_noise(x: np.ndarray) -> bool:
    """Whether a series has no sampling noise: a constant, or a schedule (its second differences
    far below its first; noise makes them larger, by sqrt(3)). A series that moves rarely, in
    steps (a count), is not one: its steps fall at other points in each run."""
    if len(x) < 4:
        return False
    if _constant(x):
        return True
    first = float(np.median(np.abs(np.diff(x))))
    second = float(np.median(np.abs(np.diff(x, 2))))
    return first > 0 and second <= _SMOOTH * first


def _wander(x: np.ndarray) -> float:
    """The slow wander: x[t + 2L] - 2 x[t + L] + x[t] has 6 times the variance of what moves
    x over L steps (noise and wander), a linear trend dropping out; the noise's share is
    taken out."""
    lag = min(_LAG, len(x) // 3)
    if lag < 2:
        return 0.0
    total = _mad(x[2 * lag:] - 2 * x[lag:-lag] + x[:-2 * lag]) / math.sqrt(6)
    return math.sqrt(max(0.0, total ** 2 - _noise(x) ** 2))


def _quantum(values: np.ndarray) -> float:
    """The rounding a logger applied: the step of the fewest decimals that hold every value
    (0 where none up to ``_DECIMALS`` does)."""
    finite = values[np.isfinite(values)]
    if len(finite) == 0:
        return 0.0
    for decimals in range(_DECIMALS + 1):
        if np.all(np.abs(finite - np.round(finite, decimals))
                  <= 1e-9 * np.maximum(np.abs(finite), 10.0 ** -decimals)):
            return 10.0 ** -decimals
    return 0.0


def _float32(values: np.ndarray) -> bool:
    """Whether every value is a float32 (TensorBoard keeps scalars so)."""
    finite = values[np.isfinite(values)]
    return len(finite) > 0 and bool(np.all(finite.astype(np.float32).astype(float) == finite))


def _same(xa: np.ndarray, xb: np.ndarray) -> np.ndarray:
    """Per step, whether the two values are one number within the formats' precision: half the
    coarser rounding, float32's relative precision where either run was kept in float32."""
    half = max(_quantum(xa), _quantum(xb)) / 2
    rel = 2 * _FLOAT32_EPS if _float32(xa) or _float32(xb) else 1e-12
    return np.abs(xa - xb) <= half + rel * np.maximum(np.abs(xa), np.abs(xb)) + 1e-300


def telemetry(metric: str) -> bool:
    """Whether a series is host or hardware telemetry (the machine's, not the training's)."""
    return metric.startswith(_TELEMETRY_PREFIXES)


def _kind(value: float) -> str:
    return "finite" if math.isfinite(value) else "NaN" if value != value else \
        "Inf" if value > 0 else "-Inf"


def _nonfinite_parting(common: Sequence[int], sa: Mapping[int, float],
                       sb: Mapping[int, float]) -> tuple[int, str] | None:
    """The first common step where one run logs NaN or Inf and the other a number or another
    non-finite value: (step, which run is non-finite: A, B or both)."""
    for step in common:
        ka, kb = _kind(sa[step]), _kind(sb[step])
        if ka != kb:
            return step, "both" if "finite" not in (ka, kb) else "A" if kb == "finite" else "B"
    return None


def _reference_ends(n: int) -> list[int]:
    """Where the noise references end: 24 steps, then every quarter more, and the run's end."""
    ends, end = [], min(_FIRST_REFERENCE, n)
    while end < n:
        ends.append(end)
        end = max(end + 1, int(end * 1.25))
    ends.append(n)
    return ends


def _curve(series: Mapping[int, float]) -> list[tuple[int, float]]:
    items = sorted(series.items())
    if len(items) > _CURVE_POINTS:
        stride = math.ceil(len(items) / _CURVE_POINTS)
        items = items[::stride] + ([items[-1]] if (len(items) - 1) % stride else [])
    return items


def _compare(metric: str, a: RunSeries, b: RunSeries, p: DiffParams, z: float
             ) -> MetricDivergence | None:
    sa, sb = a.series[metric], b.series[metric]
    common = sorted(set(sa) & set(sb))
    keys = (a.keys.get(metric, metric), b.keys.get(metric, metric))
    machine = telemetry(metric)
    odd = _nonfinite_parting(common, sa, sb)
    steps = [s for s in common if math.isfinite(sa[s]) and math.isfinite(sb[s])]
    if len(steps) < p.min_steps:
        if odd is None:
            return None
        step, which = odd
        return MetricDivergence(metric, *keys, len(common), "linear", 0.0, 0.0, 0.0, 0.0, 0.0,
                                step, sa[step], sb[step], math.inf, nonfinite=which,
                                telemetry=machine)
    found = _compare_finite(metric, keys, steps, sa, sb, p, z, machine)
    if odd is not None and (found.onset is None or odd[0] <= found.onset):
        step, which = odd
        return replace(found, steps=len(common), onset=step, a_value=sa[step],
                       b_value=sb[step], score=math.inf, nonfinite=which)
    return found


def _compare_finite(metric: str, keys: tuple[str, str], steps: Sequence[int],
                    sa: Mapping[int, float], sb: Mapping[int, float], p: DiffParams, z: float,
                    machine: bool) -> MetricDivergence:
    xa = np.array([sa[s] for s in steps], dtype=float)
    xb = np.array([sb[s] for s in steps], dtype=float)
    both = np.concatenate([xa, xb])
    differs = ~_same(xa, xb)
    smooth = _no_noise(xa) and _no_noise(xb)
    shared = min(_SHARED_START, len(steps))
    # a prefix logged alike says "same seed and data" only where the values are noisy floats;
    # a count that takes two or three values agrees by chance between runs of other seeds
    chance = len(np.unique(xa[:shared])) <= shared // 2 + 1
    if smooth or (not differs[:shared].any() and not chance) or not differs.any():
        # a schedule or a constant (no noise), or a series both runs computed alike from the
        # start (two noisy runs never log the same floats): compared value for value
        at = int(np.argmax(differs)) if differs.any() else None
        return MetricDivergence(
            metric, keys[0], keys[1], len(steps), "linear", 0.0, 0.0, 0.0, 0.0, 0.0,
            onset=steps[at] if at is not None else None,
            a_value=float(xa[at]) if at is not None else None,
            b_value=float(xb[at]) if at is not None else None,
            score=math.inf if at is not None else 0.0, exact=True,
            shared_start=not smooth, telemetry=machine)
    scale = "linear"
    if both.min() > 0 and both.max() / both.min() > _LOG_SPAN:
        scale, xa, xb = "log", np.log(xa), np.log(xb)
    discrete = float(np.median(np.abs(np.diff(xa)))) == 0 or \
        float(np.median(np.abs(np.diff(xb)))) == 0
    width = min(p.smooth, len(steps))
    ma, mb = _trailing_median(xa, width), _trailing_median(xb, width)
    spread = _MEDIAN_EFFICIENCY / math.sqrt(width)
    # the formats' precision, in the scale's units: a difference below it is none
    precision = 4 * _FLOAT32_EPS if scale == "log" else \
        max(_quantum(xa), _quantum(xb)) / 2 + 4 * _FLOAT32_EPS * float(np.median(np.abs(both)))
    ends = _reference_ends(len(steps))
    bars: dict[int, tuple[float, float, float, float, float]] = {}

    def bar(end: int) -> tuple[float, float, float, float, float]:
        """The departure's bar from the steps before ``end``: (bar, noise A, B, wander A, B)."""
        if end not in bars:
            ra, rb = xa[:end], xb[:end]
            na, nb, wa, wb = _noise(ra), _noise(rb), _wander(ra), _wander(rb)
            level = float(np.median(np.abs(np.concatenate([ra, rb])))) \
                if scale == "linear" else 0.0
            # a run that parts ways inflates its own wander (its new trend looks like some):
            # slower to call, never quicker; the quieter run's alone came out near 0 by chance
            # too often
            sd = math.sqrt(spread ** 2 * (na ** 2 + nb ** 2) + wa ** 2 + wb ** 2)
            bars[end] = (z * max(sd, p.relative_floor * level, precision, 1e-12), na, nb, wa, wb)
        return bars[end]

    def reference(i: int) -> int:
        """The reference judging step ``i``: the longest that ends before its median's first
        value (the first one where the run is too short for that)."""
        limit = max(ends[0], i - width + 1)
        return max(e for e in ends if e <= limit) if limit < len(steps) else ends[-1]

    diff = ma - mb
    onset = None
    run = 0
    frozen = 0
    for i in range(width - 1, len(steps)):  # judged once the medians hold `smooth` steps
        end = frozen if run else reference(i)
        threshold = bar(end)[0]
        over = abs(diff[i]) > threshold
        if over and run and np.sign(diff[i]) == np.sign(diff[i - 1]):
            run += 1
        else:
            run = int(over)
            frozen = end
        if run >= p.persist:
            onset = i - run + 1
            break
    final = frozen if onset is not None else ends[-1]
    threshold, na, nb, wa, wb = bar(final)
    if onset is None:
        return MetricDivergence(metric, *keys, len(steps), scale, na, nb, wa, wb, threshold,
                                telemetry=machine, discrete=discrete)
    end = onset + p.persist - 1
    onset = _change_point(np.sign(diff[onset]) * (xa - xb), onset, end, width, threshold)
    back = math.exp if scale == "log" else float
    return MetricDivergence(metric, *keys, len(steps), scale, na, nb, wa, wb, threshold,
                            steps[onset], back(float(ma[end])), back(float(mb[end])),
                            float(abs(diff[end]) / threshold), telemetry=machine,
                            discrete=discrete, value_step=int(steps[end]))


def _change_point(raw: np.ndarray, first: int, end: int, width: int, bar: float) -> int:
    """Where the departure the medians saw began: they answer a few steps late (a median of
    ``width`` moves once more than half its values have). The one-sided CUSUM's estimate: the
    start ``k`` (from ``width - 1`` steps before the medians' first step to it) that maximises
    the sum of ``raw - bar`` from ``k`` to the departure's last persisted step; a step within
    the bar before the change counts against starting there."""
    lo = max(0, first - width + 1)
    gains = np.cumsum((raw[lo:end + 1] - bar)[::-1])[::-1]  # the sum from each k to `end`
    return lo + int(np.argmax(gains[:first - lo + 1]))


def diff_runs(a: RunSeries, b: RunSeries, params: DiffParams | None = None) -> DiffResult:
    """Compare every metric both runs logged; see the module's docstring for the test."""
    p = params or DiffParams()
    shared = [m for m in a.series if m in b.series]
    # the union bound over the metrics and over the run's stretches of `persist` steps: a
    # longer run, or more metrics, are more chances for the noise alone to look like a parting
    steps = len({s for m in shared for s in a.series[m]})
    z = math.sqrt(p.z ** 2 + 2 * math.log(max(len(shared) * steps / p.persist, 1)))
    compared = [d for d in (_compare(m, a, b, p, z) for m in shared) if d is not None]
    compared.sort(key=lambda d: (d.telemetry, not d.diverged,
                                 d.onset if d.onset is not None else 0, -d.score, d.metric))
    common = len({s for m in shared for s in a.series[m]} & {s for m in shared
                                                             for s in b.series[m]})
    training = [d for d in compared if not d.telemetry] or compared
    shown = [d.metric for d in training if d.diverged][:6] or [d.metric for d in training][:2]
    curves = {m: (_curve(a.series[m]), _curve(b.series[m])) for m in shown}
    return DiffResult(a, b, p, common, tuple(compared),
                      tuple(setting_differences(a.config, b.config)),
                      tuple(m for m in a.series if m not in b.series),
                      tuple(m for m in b.series if m not in a.series), curves)
