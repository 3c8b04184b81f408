"""The baseline detector's predictions for a whole recorded series at once, bit for bit.

Live, the detector (:mod:`rlmon.service.alerting.baseline`) predicts each step from its trailing
window: a few sorts of 60 values in Python, some 30 us. A recorded run of a million steps
(``rlmon diagnose`` of a long ``trainer_state.json``, ``rlmon replay``) asks that of every step
of every baseline rule: minutes. When a batch of steps is evaluated in order
(:func:`~rlmon.service.alerting.engine.evaluate_in_order`) the values each rule will see are
known in advance, so the windows' robust lines are computed here with numpy, a block of steps at
a time, in the same floating-point operations in the same order (sorted windows, the two middle
values' mean as ``0.5 * (a + b)``, the transform by ``math.log`` itself), so each prediction is
the number :func:`~rlmon.service.alerting.baseline.predict` returns. The CUSUM and the alert's
state machine still run step by step in the engine, which takes a prediction from here only
while the value it observes is the one this series expected at that place and its window has
the expected length; anything else (a skipped step, a restart, a window with a non-finite
intermediate) falls back to ``predict``.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from rlmon.service.alerting import baseline
from rlmon.service.metrics.spec import BaselineParams

__all__ = ["MIN_SERIES", "SeriesPredictions", "transform"]

MIN_SERIES = 2_000  # below this the step-by-step prediction is as fast as preparing a batch
_BLOCK = 8_192  # windows predicted at a time (a block of 60-value windows is a few MB)
Prediction = baseline.Prediction


def transform(params: BaselineParams, values: Sequence[float] | np.ndarray) -> np.ndarray:
    """``baseline._transform`` of each value, bit for bit: ``max(v, 0.0)`` as Python picks it
    (NaN and -0.0 kept), the offset added in float64, then ``math.log`` itself (numpy's log may
    round differently), mapped in C over the values instead of a Python call per value."""
    raw = np.array(values, dtype=np.float64)
    if params.log_offset is None:
        return raw
    shifted = np.where(raw < 0.0, 0.0, raw) + params.log_offset
    return np.fromiter(map(math.log, shifted.tolist()), dtype=np.float64, count=len(shifted))


def _median(ordered: np.ndarray) -> np.ndarray:
    """Row medians of row-sorted windows, as ``baseline._median`` takes them."""
    n = ordered.shape[1]
    mid = n // 2
    if n % 2:
        return ordered[:, mid]
    return 0.5 * (ordered[:, mid - 1] + ordered[:, mid])


def _block(params: BaselineParams, series: np.ndarray, n: int,
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(expected extrapolated, scale, expected level, scale, all finite) per window of ``n``
    values of ``series`` (window k: ``series[k:k + n]``)."""
    windows = np.ascontiguousarray(sliding_window_view(series, n))
    rows = len(windows)
    half = n // 2
    if params.follow_drift:
        # the halves' medians from one sort of every half-window (the same rows, sorted from
        # the same order): window k's first half is half-window k, its second k + n - half
        halves = _median(np.sort(sliding_window_view(series, half), axis=1))
        slope = (halves[n - half:n - half + rows] - halves[:rows]) / (n - half)
        # min(slope, 0.0) / max(slope, 0.0) as Python picks them
        slope = np.where(slope > 0.0, 0.0, slope) if params.direction == "down" \
            else np.where(slope < 0.0, 0.0, slope)
    else:
        slope = np.zeros(rows)
    centre = (n - 1) / 2
    offsets = np.arange(n, dtype=np.float64) - centre
    # sorted in place: fresh arrays, and the residuals' median does not depend on their order
    detrended = windows - slope[:, None] * offsets[None, :]
    detrended.sort(axis=1)
    level = _median(detrended)
    residuals = np.abs(detrended - level[:, None])
    residuals.sort(axis=1)
    mad = _median(residuals)
    ordered = np.sort(windows, axis=1)
    gaps = ordered[:, 1:] - ordered[:, :-1]
    resolution = np.where(gaps > 0.0, gaps, np.inf).min(axis=1)
    resolution = np.where(np.isinf(resolution), 0.0, resolution)
    spread = baseline._MAD_TO_SD * mad
    # a quarter of the window at one bound: the spread off the pile where larger (as
    # baseline.predict; by the same function, the few such windows one at a time)
    q = n // 4
    for row in np.flatnonzero((ordered[:, q] == ordered[:, 0])
                              | (ordered[:, n - 1 - q] == ordered[:, n - 1])).tolist():
        spread[row] = max(spread[row], baseline.spread_at_bound(ordered[row].tolist()))

    def scale(expected: np.ndarray) -> np.ndarray:
        if params.log_offset is None:
            relative = params.relative_floor * np.abs(expected)
            floor = np.where(relative > params.floor, relative, params.floor)
        else:
            floor = np.full(rows, math.log1p(params.relative_floor))
        return np.maximum(np.maximum(np.maximum(spread, floor), resolution), baseline._TINY)

    extrapolated = level + slope * (n - centre)
    scale_extrapolated, scale_level = scale(extrapolated), scale(level)
    finite = (np.isfinite(windows).all(axis=1) & np.isfinite(extrapolated)
              & np.isfinite(scale_extrapolated) & np.isfinite(scale_level)
              & np.isfinite(gaps).all(axis=1))
    return extrapolated, scale_extrapolated, level, scale_level, finite


class SeriesPredictions:
    """The predictions for each value of one rule's series, handed out in order.

    :meth:`take` is called once per value the detector observes, with its window; it answers
    ((expected, scale) extrapolated, (expected, scale) at the window's level) for that place,
    or None where the detector must predict itself (warm-up, a non-finite window, or once what
    it observes has left the series: then never again)."""

    def __init__(self, params: BaselineParams, values: Sequence[float]) -> None:
        self.params = params
        self._raw = array("d", values)
        self._transformed = transform(params, values)
        self._index = 0
        self._on_track = True
        self._block_start = -1
        self._block: tuple[list[float], list[float], list[float], list[float], list[bool]] \
            | None = None

    def _compute(self, start: int) -> None:
        window = self.params.window
        stop = min(start + _BLOCK, len(self._raw))
        # the window before value i is transformed[i - window:i]
        extrapolated, scale_extrapolated, level, scale_level, finite = _block(
            self.params, self._transformed[start - window:stop - 1], window)
        # as Python floats: indexing a list is far cheaper than making a numpy scalar
        self._block = (extrapolated.tolist(), scale_extrapolated.tolist(), level.tolist(),
                       scale_level.tolist(), finite.tolist())
        self._block_start = start

    @property
    def taken(self) -> int:
        """Values of the series observed so far (the place of the next)."""
        return self._index

    def skip(self, count: int) -> None:
        """``count`` values observed without :meth:`take` (a quiet stretch judged at once:
        :mod:`rlmon.service.alerting.quiet_steps`)."""
        self._index += count

    def extrapolated(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(expected, scale, usable) of the extrapolated predictions of values ``start`` to
        ``stop`` (each at least ``window``: full windows), in the detector's space, and the
        values themselves transformed: what :meth:`take` hands out there, for many at once."""
        window = self.params.window
        assert start >= window
        expected, scale, _, _, finite = _block(
            self.params, self._transformed[start - window:stop - 1], window)
        return expected, scale, finite

    def transformed(self, start: int, stop: int) -> np.ndarray:
        return self._transformed[start:stop]

    def take(self, window_length: int, value: float) -> Prediction | None:
        i = self._index
        window = self.params.window
        if not self._on_track or i >= len(self._raw) or self._raw[i] != value \
                or window_length != min(i, window):
            self._on_track = False
            return None
        self._index = i + 1
        if i < window:
            return None  # the window still filling: few values, predicted step by step
        if self._block is None or not self._block_start <= i < self._block_start + _BLOCK:
            self._compute(i)
        assert self._block is not None
        k = i - self._block_start
        extrapolated, scale_extrapolated, level, scale_level, finite = self._block
        if not finite[k]:
            return None
        return (extrapolated[k], scale_extrapolated[k]), (level[k], scale_level[k])
