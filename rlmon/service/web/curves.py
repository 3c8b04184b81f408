"""A run's curves from the history store, downsampled on the server so a long run loads fast.

Each (run, role, attempt)'s columns are read once and cached; later requests read only the steps
added since. The catalog's key curves come from the rows the history store packs beside each step
(:mod:`rlmon.service.storage.curve_rows`: a 100,000-step run's are about 10 MB); other metrics,
or a store written before those rows were kept and opened read-only, are pulled out of the step
lines by SQLite (seconds for a 100,000-step run). Downsampling keeps, per
step bucket and per series, the first, last, lowest and highest point (the M4 scheme): a spike
or a collapse inside a bucket is never averaged away.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rlmon.service.metrics.nonfinite import NONFINITE_VALUES
from rlmon.service.storage import curve_rows
from rlmon.service.storage.history import HistoryStore

__all__ = ["ColumnCache", "Columns", "downsample"]


@dataclass(frozen=True, slots=True)
class Columns:
    """Steps (sorted) and one float column per metric (NaN where the step lacks it, NaN or
    ±inf where it reported so), with where the reported value was NaN or infinite."""

    steps: np.ndarray
    values: dict[str, np.ndarray]
    count: int  # rows read, to notice a step that arrived out of order
    nonfinite: dict[str, np.ndarray]  # per metric: the step reported NaN or ±inf

    def window(self, first: int | None, last: int | None) -> Columns:
        lo = 0 if first is None else int(np.searchsorted(self.steps, first, "left"))
        hi = len(self.steps) if last is None else int(np.searchsorted(self.steps, last, "right"))
        return Columns(self.steps[lo:hi], {k: v[lo:hi] for k, v in self.values.items()},
                       hi - lo, {k: v[lo:hi] for k, v in self.nonfinite.items()})

    def extended(self, new: Columns) -> Columns:
        return Columns(np.concatenate([self.steps, new.steps]), {
            m: np.concatenate([v, new.values[m]]) for m, v in self.values.items()},
            self.count + new.count, {
            m: np.concatenate([v, new.nonfinite[m]]) for m, v in self.nonfinite.items()})


def _empty(metrics: Sequence[str]) -> Columns:
    return Columns(np.zeros(0, np.int64), {m: np.zeros(0) for m in metrics}, 0,
                   {m: np.zeros(0, bool) for m in metrics})


# SQL text is constant: the metrics' names reach SQLite only as bound parameters, never pasted
# into the SQL (issue 32). A name of plain ASCII without a quote or backslash is looked up
# through a bound JSON path ('$.metrics."<name>"': SQLite parses a line once for all the paths of
# a row); any other name (a '"' cannot be written in a path) is matched against each line's keys.
_PATHS = 32  # JSON paths per query, unused ones padded with a path no line holds
_BY_PATH = (
    "SELECT step, "
    "json_extract(line, ?), json_extract(line, ?), json_extract(line, ?), json_extract(line, ?), "
    "json_extract(line, ?), json_extract(line, ?), json_extract(line, ?), json_extract(line, ?), "
    "json_extract(line, ?), json_extract(line, ?), json_extract(line, ?), json_extract(line, ?), "
    "json_extract(line, ?), json_extract(line, ?), json_extract(line, ?), json_extract(line, ?), "
    "json_extract(line, ?), json_extract(line, ?), json_extract(line, ?), json_extract(line, ?), "
    "json_extract(line, ?), json_extract(line, ?), json_extract(line, ?), json_extract(line, ?), "
    "json_extract(line, ?), json_extract(line, ?), json_extract(line, ?), json_extract(line, ?), "
    "json_extract(line, ?), json_extract(line, ?), json_extract(line, ?), json_extract(line, ?) "
    "FROM steps WHERE run = ? AND role = ? AND attempt = ? AND step > ? ORDER BY step")
_NO_PATH = "$.rlmon_none"
_BY_KEY = ("SELECT s.step, m.value FROM steps AS s, json_each(s.line, ?) AS m "
           "WHERE s.run = ? AND s.role = ? AND s.attempt = ? AND s.step > ? AND m.key = ?")
_STEPS = ("SELECT step FROM steps WHERE run = ? AND role = ? AND attempt = ? AND step > ? "
          "ORDER BY step")
_BEFORE_ANY = -(2**63)  # "after" when every step is wanted


def _pathable(metric: str) -> bool:
    return metric.isascii() and metric.isprintable() and '"' not in metric and "\\" not in metric


def _read_packed(store: HistoryStore, key: tuple[str, str, int], metrics: Sequence[str],
                 after: int | None) -> Columns | None:
    """The columns from the packed key-curve rows; None where the store lacks them."""
    if not set(metrics) <= set(curve_rows.CURVE_METRICS):
        return None
    rows = store.curve_values(*key, after)
    if rows is None:
        return None
    if not rows:
        return _empty(metrics)
    steps = np.fromiter((s for s, _ in rows), np.int64, len(rows))
    table, absent = curve_rows.unpack([b for _, b in rows])
    values, nonfinite = {}, {}
    for metric in metrics:
        i = curve_rows.CURVE_METRICS.index(metric)
        values[metric] = table[:, i]
        nonfinite[metric] = ~np.isfinite(table[:, i]) & ~absent[:, i]
    return Columns(steps, values, len(rows), nonfinite)


def _read(store: HistoryStore, key: tuple[str, str, int], metrics: Sequence[str],
          after: int | None) -> Columns:
    packed = _read_packed(store, key, metrics, after)
    if packed is not None:
        return packed
    run, role, attempt = key
    stream = (run, role, attempt, _BEFORE_ANY if after is None else after)
    steps = np.fromiter((s for (s,) in store.read(_STEPS, stream)), np.int64)
    if not len(steps):
        return _empty(metrics)
    values = np.full((len(metrics), len(steps)), np.nan)
    nonfinite = np.zeros((len(metrics), len(steps)), bool)

    by_path = [i for i, m in enumerate(metrics) if _pathable(m)]
    per_query = _PATHS // 2
    for first in range(0, len(by_path), per_query):
        chunk = by_path[first:first + per_query]
        paths = [p for i in chunk for p in (f'$.metrics."{metrics[i]}"',
                                            f'$.nonfinite."{metrics[i]}"')]
        paths += [_NO_PATH] * (_PATHS - len(paths))
        rows = store.read(_BY_PATH, (*paths, *stream))
        if not rows:
            continue
        table = np.array(rows, dtype=object)
        # placed by step: a step written between the queries is left for the next read
        found = table[:, 0].astype(np.int64)
        at = np.minimum(np.searchsorted(steps, found), len(steps) - 1)
        known = steps[at] == found
        at = at[known]
        for j, i in enumerate(chunk):
            column, named = table[known, 1 + 2 * j], table[known, 2 + 2 * j]
            reported = named != None  # noqa: E711 (elementwise)
            column[reported] = [NONFINITE_VALUES[str(t)] for t in named[reported]]
            column[column == None] = np.nan  # noqa: E711 (elementwise)
            values[i, at] = column.astype(np.float64)
            nonfinite[i, at] = reported.astype(bool)
    for i, metric in enumerate(metrics):
        if i in by_path:
            continue
        for step, value in store.read(_BY_KEY, ("$.metrics", *stream, metric)):
            at = np.searchsorted(steps, step)
            if at < len(steps) and steps[at] == step:  # else: written between the queries
                values[i, at] = np.nan if value is None else value
        for step, text in store.read(_BY_KEY, ("$.nonfinite", *stream, metric)):
            at = np.searchsorted(steps, step)
            if at < len(steps) and steps[at] == step:
                values[i, at] = NONFINITE_VALUES[str(text)]
                nonfinite[i, at] = True
    return Columns(steps, {m: values[i] for i, m in enumerate(metrics)}, len(steps),
                   {m: nonfinite[i] for i, m in enumerate(metrics)})


class ColumnCache:
    """Cached columns per (run, role, attempt, metrics), the least recently used leaving first:
    a 100,000-step stream of 13 key metrics holds 11 MB, so the default 8 hold at most ~90 MB."""

    def __init__(self, store: HistoryStore, capacity: int = 8) -> None:
        self._store = store
        self._capacity = capacity
        self._cache: OrderedDict[tuple[object, ...], Columns] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._cache)

    def get(self, run: str, role: str, attempt: int, metrics: Sequence[str]) -> Columns:
        key = (run, role, attempt, tuple(metrics))
        with self._lock:
            known = self._cache.get(key)
        stream = (run, role, attempt)
        if known is not None and len(known.steps):
            last = int(known.steps[-1])
            # a step finalized late, below the cached last one: read the whole stream again
            (count,), = self._store.read(
                "SELECT COUNT(*) FROM steps WHERE run = ? AND role = ? AND attempt = ? AND "
                "step <= ?", (run, role, attempt, last))
            if count == known.count:
                new = _read(self._store, stream, metrics, last)
                if new.count:
                    known = known.extended(new)
            else:
                known = None
        if known is None or not len(known.steps):
            known = _read(self._store, stream, metrics, None)
        with self._lock:
            self._cache[key] = known
            self._cache.move_to_end(key)
            while len(self._cache) > self._capacity:
                self._cache.popitem(last=False)
        return known


def _first_per_bucket(hits: np.ndarray, bucket: np.ndarray) -> np.ndarray:
    """The first index of ``hits`` (sorted positions) in each bucket it touches."""
    if not len(hits):
        return hits
    b = bucket[hits]
    return hits[np.r_[True, b[1:] != b[:-1]]]


def downsample(steps: np.ndarray, series: Sequence[np.ndarray], buckets: int) -> np.ndarray:
    """Indices to keep so that each of ``buckets`` equal step ranges keeps, for every series,
    its first, last, lowest and highest finite point; all indices when there are few."""
    n = len(steps)
    if n <= 4 * buckets or buckets < 1:
        return np.arange(n)
    span = int(steps[-1]) - int(steps[0]) + 1
    bucket = ((steps - steps[0]) * buckets) // span
    keep = np.zeros(n, dtype=bool)
    for values in series:
        idx = np.flatnonzero(np.isfinite(values))
        if not len(idx):
            continue
        b = bucket[idx]
        starts = np.r_[0, np.flatnonzero(b[1:] != b[:-1]) + 1]
        counts = np.diff(np.r_[starts, len(idx)])
        keep[idx[starts]] = True  # first
        keep[idx[starts + counts - 1]] = True  # last
        v = values[idx]
        for reduce in (np.minimum, np.maximum):
            extreme = np.repeat(reduce.reduceat(v, starts), counts)
            keep[_first_per_bucket(idx[v == extreme], bucket)] = True
    return np.flatnonzero(keep)
