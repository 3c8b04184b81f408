"""The columnar block of an open step: the numpy fast path of step assembly.

A step's columnar blocks are summed (min-ed, max-ed, by the forms' merge in
:mod:`rlmon.service.metrics.forms`) per schema with numpy while the step is open, and folded into the
step's metric pools once, when the step closes. Rows merge in arrival order, as the pools do, so
the values are bit-for-bit those of the scalar path (``tests/unit/aggregation/test_aggregator_columnar.py``).
"""

from __future__ import annotations

import numpy as np

from rlmon.service.contract.step_message import Schema, row_state
from rlmon.service.metrics.partial import MetricPool
from rlmon.service.metrics.rank import Rank
from rlmon.service.metrics.spec import Form

__all__ = ["StepBlock"]

_NO_RANK = Rank()


class StepBlock:
    """The columnar accumulator of one open step: one row per metric name, in first-seen order.

    Messages with the step's first schema (the common case: every rank sends the same metrics)
    merge with three slice operations; another schema is mapped onto the rows once and then
    merges through index arrays. Either way each row folds its values in arrival order, as the
    core does, so the result is bit-for-bit the core's.
    """

    __slots__ = ("data", "forms", "index", "maps", "names", "primary")

    def __init__(self, schema: Schema, values: np.ndarray) -> None:
        self.data = np.array(values, dtype=np.float64, copy=True)
        self.names: list[str] = list(schema.names)
        self.forms: list[Form] = list(schema.forms)
        self.index = {name: i for i, name in enumerate(schema.names)}
        self.primary = schema.id
        self.maps: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def merge(self, schema: Schema, values: np.ndarray) -> None:
        a, b = schema.n_add, schema.n_add + schema.n_min
        data = self.data
        if schema.id == self.primary:
            data[:a] += values[:a]
            np.minimum(data[a:b], values[a:b], out=data[a:b])  # NaN wins, as in the core
            n = len(schema.names)
            np.maximum(data[b:n], values[b:], out=data[b:n])
            return
        mapping = self.maps.get(schema.id)
        if mapping is None:
            fresh = [i for i, name in enumerate(schema.names) if name not in self.index]
            for i in fresh:
                self.index[schema.names[i]] = len(self.names)
                self.names.append(schema.names[i])
                self.forms.append(schema.forms[i])
            rows = np.array([self.index[n] for n in schema.names], dtype=np.intp)
            mapping = self.maps[schema.id] = (rows[:a], rows[a:b], rows[b:])
            if fresh:
                self.data = data = np.vstack([data, values[fresh]])
                keep = np.ones(len(schema.names), dtype=bool)
                keep[fresh] = False
                self._combine(
                    tuple(m[keep[lo:hi]] for m, (lo, hi) in zip(
                        mapping, ((0, a), (a, b), (b, len(keep))), strict=True)),
                    (values[:a][keep[:a]], values[a:b][keep[a:b]], values[b:][keep[b:]]),
                )
                return
        self._combine(mapping, (values[:a], values[a:b], values[b:]))

    def _combine(
        self, rows: tuple[np.ndarray, ...], vals: tuple[np.ndarray, ...]
    ) -> None:
        data = self.data
        data[rows[0]] += vals[0]
        data[rows[1]] = np.minimum(data[rows[1]], vals[1])
        data[rows[2]] = np.maximum(data[rows[2]], vals[2])

    def fold_into(self, pools: dict[str, MetricPool]) -> None:
        """Add every row to ``pools`` as the core's metric pools (once, when the step closes)."""
        for name, form, row in zip(self.names, self.forms, self.data.tolist(), strict=True):
            pool = MetricPool(form, None, False)
            pool.add(_NO_RANK, 0, row_state(form, row))
            mine = pools.get(name)
            if mine is None:
                pools[name] = pool
            else:
                mine.merge(pool)
