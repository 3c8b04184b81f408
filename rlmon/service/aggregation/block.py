"""The columnar block of an open step: the numpy fast path of step assembly.

A step's columnar blocks are summed (min-ed, max-ed, by the forms' merge in
:mod:`rlmon.service.metrics.forms`) per schema with numpy while the step is open, and folded into the
step's metric pools once, when the step closes. Rows merge in arrival order, as the pools do, so
the values are bit-for-bit those of the scalar path (``tests/unit/aggregation/test_aggregator_columnar.py``).

A message is one rank's whole contribution to the step, so the block also keeps, per row, the
lowest and highest of the ranks' own values (each message's states finalized, with numpy, as
:data:`~rlmon.service.metrics.forms.FORMS` finalizes one state) and how many ranks had one: the
per-rank extremes the page draws as a band. Block metrics are never replicated, so every
message is a rank of its own.
"""

from __future__ import annotations

import numpy as np

from rlmon.service.contract.step_message import Schema, row_state
from rlmon.service.metrics.partial import MetricPool, RankExtremes
from rlmon.service.metrics.rank import Rank
from rlmon.service.metrics.spec import Form

__all__ = ["StepBlock", "own_values", "plan_of"]

_NO_RANK = Rank()
# Per schema, the rows of each form that finalizes otherwise than as its first slot
_Plan = tuple[np.ndarray, np.ndarray, np.ndarray]  # mean, sqsum, moments rows


def plan_of(schema: Schema) -> _Plan:
    """The rows of ``schema`` that finalize otherwise than as their first slot, by form."""
    forms = schema.forms
    return (np.array([i for i, f in enumerate(forms) if f is Form.MEAN], dtype=np.intp),
            np.array([i for i, f in enumerate(forms) if f is Form.SQSUM], dtype=np.intp),
            np.array([i for i, f in enumerate(forms) if f is Form.MOMENTS], dtype=np.intp))


def own_values(schema: Schema, values: np.ndarray, plan: _Plan | None = None,
               ) -> tuple[np.ndarray, np.ndarray]:
    """One rank's message finalized row by row, as each form's ``finalize`` does one state (a
    sum, a min, a max: its slot; a mean: sum / count; an L2 norm: the root; moments: the std):
    the values and whether each is defined (a mean over zero tokens is not, unless its sum is
    NaN or infinite, which propagates)."""
    means, norms, moments = plan if plan is not None else plan_of(schema)
    first = values[:, 0]
    out = first.copy()
    defined = np.ones(len(first), dtype=bool)
    with np.errstate(divide="ignore", invalid="ignore"):
        if len(means):
            total, count = first[means], values[means, 1]
            empty = count == 0
            out[means] = np.where(empty, total, total / count)
            defined[means[empty & np.isfinite(total)]] = False
        if len(norms):
            x = first[norms]
            out[norms] = np.where(x < 0, np.nan, np.sqrt(x))
        if len(moments):
            count, total, sqsum = first[moments], values[moments, 1], values[moments, 2]
            mean = total / count
            variance = sqsum / count - mean * mean
            std = np.where(variance != variance, np.nan, np.sqrt(np.maximum(variance, 0.0)))
            empty = count == 0
            out[moments] = np.where(empty, np.nan, std)
            defined[moments[empty & np.isfinite(total) & np.isfinite(sqsum)]] = False
    return out, defined


class StepBlock:
    """The columnar accumulator of one open step: one row per metric name, in first-seen order.

    Messages with the step's first schema (the common case: every rank sends the same metrics)
    merge with three slice operations; another schema is mapped onto the rows once and then
    merges through index arrays. Either way each row folds its values in arrival order, as the
    core does, so the result is bit-for-bit the core's.
    """

    __slots__ = ("data", "forms", "hi", "index", "lo", "maps", "names", "plans", "primary",
                 "ranks", "rows")

    def __init__(self, schema: Schema, values: np.ndarray) -> None:
        self.data = np.array(values, dtype=np.float64, copy=True)
        self.names: list[str] = list(schema.names)
        self.forms: list[Form] = list(schema.forms)
        self.index = {name: i for i, name in enumerate(schema.names)}
        self.primary = schema.id
        self.maps: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self.rows: dict[int, np.ndarray] = {}  # a mapped schema's rows, in its order
        self.plans: dict[int, _Plan] = {}  # each schema's rows by how they finalize
        # per row: the lowest and highest rank's own value, and the ranks that had one
        n = len(schema.names)
        self.lo = np.full(n, np.inf)
        self.hi = np.full(n, -np.inf)
        self.ranks = np.zeros(n, dtype=np.int64)
        self._note(slice(0, n), schema, values)

    def _note(self, rows: slice | np.ndarray, schema: Schema, values: np.ndarray) -> None:
        """Fold one rank's own values into the rows' extremes (np.minimum and np.maximum let
        NaN win, as the forms' min and max do)."""
        plan = self.plans.get(schema.id)
        if plan is None:
            plan = self.plans[schema.id] = plan_of(schema)
        own, defined = own_values(schema, values, plan)
        low = high = own
        if not defined.all():  # an undefined value leaves its row's extremes as they are
            low, high = np.where(defined, own, np.inf), np.where(defined, own, -np.inf)
        if isinstance(rows, slice):  # the step's first schema: views, updated in place
            np.minimum(self.lo[rows], low, out=self.lo[rows])
            np.maximum(self.hi[rows], high, out=self.hi[rows])
        else:
            self.lo[rows] = np.minimum(self.lo[rows], low)
            self.hi[rows] = np.maximum(self.hi[rows], high)
        self.ranks[rows] += defined

    def merge(self, schema: Schema, values: np.ndarray) -> None:
        a, b = schema.n_add, schema.n_add + schema.n_min
        data = self.data
        if schema.id == self.primary:
            data[:a] += values[:a]
            np.minimum(data[a:b], values[a:b], out=data[a:b])  # NaN wins, as in the core
            n = len(schema.names)
            np.maximum(data[b:n], values[b:], out=data[b:n])
            self._note(slice(0, n), schema, values)
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
            self.rows[schema.id] = rows
            if fresh:
                self.data = data = np.vstack([data, values[fresh]])
                more = len(fresh)
                self.lo = np.concatenate([self.lo, np.full(more, np.inf)])
                self.hi = np.concatenate([self.hi, np.full(more, -np.inf)])
                self.ranks = np.concatenate([self.ranks, np.zeros(more, dtype=np.int64)])
                self._note(rows, schema, values)
                keep = np.ones(len(schema.names), dtype=bool)
                keep[fresh] = False
                self._combine(
                    tuple(m[keep[lo:hi]] for m, (lo, hi) in zip(
                        mapping, ((0, a), (a, b), (b, len(keep))), strict=True)),
                    (values[:a][keep[:a]], values[a:b][keep[a:b]], values[b:][keep[b:]]),
                )
                return
        self._note(self.rows[schema.id], schema, values)
        self._combine(mapping, (values[:a], values[a:b], values[b:]))

    def extremes(self) -> dict[str, RankExtremes]:
        """Per metric, the lowest and highest rank's own value and how many ranks had one."""
        return {name: (lo, hi, n) for name, lo, hi, n in zip(
            self.names, self.lo.tolist(), self.hi.tolist(), self.ranks.tolist(), strict=True)
            if n}

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
            pool = MetricPool(form, None, False, by_rank=False)  # the ranks folded together
            pool.add(_NO_RANK, 0, row_state(form, row))
            mine = pools.get(name)
            if mine is None:
                pools[name] = pool
            else:
                mine.merge(pool)
