"""The columnar block of an open step: the numpy fast path of step assembly.

A step's columnar blocks are summed (min-ed, max-ed, by the forms' merge in
:mod:`rlmon.service.metrics.forms`) per schema with numpy while the step is open, and folded into the
step's metric pools once, when the step closes. Rows merge in arrival order, as the pools do, so
the values are bit-for-bit those of the scalar path (``tests/unit/aggregation/test_aggregator_columnar.py``).

A message is one rank's whole contribution to the step, so the block also keeps each message's
rows until the step closes and then finalizes them all at once, with numpy, as
:data:`~rlmon.service.metrics.forms.FORMS` finalizes one state: the lowest and highest of the
ranks' own values per row, and how many ranks had one (the per-rank extremes the page draws as a
band). Block metrics are never replicated, so every message is a rank of its own. Keeping the
messages' arrays (never written to) costs a list append per message, not a copy.
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
    """Ranks' messages (``(..., rows, 3)``: one message, or a stack of them) finalized row by
    row, as each form's ``finalize`` does one state (a sum, a min, a max: its slot; a mean:
    sum / count; an L2 norm: the root; moments: the std): the values and whether each is defined
    (a mean over zero tokens is not, unless its sum is NaN or infinite, which propagates)."""
    means, norms, moments = plan if plan is not None else plan_of(schema)
    first = values[..., 0]
    out = first.copy()
    defined = np.ones(first.shape, dtype=bool)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # as Python floats do
        if len(means):
            total, count = first[..., means], values[..., means, 1]
            empty = count == 0
            out[..., means] = np.where(empty, total, total / count)
            defined[..., means] = ~(empty & np.isfinite(total))
        if len(norms):
            x = first[..., norms]
            out[..., norms] = np.where(x < 0, np.nan, np.sqrt(x))
        if len(moments):
            count, total, sqsum = (first[..., moments], values[..., moments, 1],
                                   values[..., moments, 2])
            mean = total / count
            variance = sqsum / count - mean * mean
            std = np.where(variance != variance, np.nan, np.sqrt(np.maximum(variance, 0.0)))
            empty = count == 0
            out[..., moments] = np.where(empty, np.nan, std)
            defined[..., moments] = ~(empty & np.isfinite(total) & np.isfinite(sqsum))
    return out, defined


class StepBlock:
    """The columnar accumulator of one open step: one row per metric name, in first-seen order.

    Messages with the step's first schema (the common case: every rank sends the same metrics)
    merge with three slice operations; another schema is mapped onto the rows once and then
    merges through index arrays. Either way each row folds its values in arrival order, as the
    core does, so the result is bit-for-bit the core's.
    """

    __slots__ = ("data", "forms", "index", "maps", "names", "primary", "sent")

    def __init__(self, schema: Schema, values: np.ndarray) -> None:
        self.data = np.array(values, dtype=np.float64, copy=True)
        self.names: list[str] = list(schema.names)
        self.forms: list[Form] = list(schema.forms)
        self.index = {name: i for i, name in enumerate(schema.names)}
        self.primary = schema.id
        self.maps: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        # per schema: it, its rows in the block (in its order), and each rank's message's values
        self.sent: dict[int, tuple[Schema, slice | np.ndarray, list[np.ndarray]]] = {
            schema.id: (schema, slice(0, len(schema.names)), [values])}

    def merge(self, schema: Schema, values: np.ndarray) -> None:
        a, b = schema.n_add, schema.n_add + schema.n_min
        data = self.data
        if schema.id == self.primary:
            data[:a] += values[:a]
            np.minimum(data[a:b], values[a:b], out=data[a:b])  # NaN wins, as in the core
            n = len(schema.names)
            np.maximum(data[b:n], values[b:], out=data[b:n])
            self.sent[schema.id][2].append(values)
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
            self.sent[schema.id] = (schema, rows, [])
            if fresh:
                self.sent[schema.id][2].append(values)
                self.data = data = np.vstack([data, values[fresh]])
                keep = np.ones(len(schema.names), dtype=bool)
                keep[fresh] = False
                self._combine(
                    tuple(m[keep[lo:hi]] for m, (lo, hi) in zip(
                        mapping, ((0, a), (a, b), (b, len(keep))), strict=True)),
                    (values[:a][keep[:a]], values[a:b][keep[a:b]], values[b:][keep[b:]]),
                )
                return
        self.sent[schema.id][2].append(values)
        self._combine(mapping, (values[:a], values[a:b], values[b:]))

    def extremes(self) -> dict[str, RankExtremes]:
        """Per metric, the lowest and highest rank's own value and how many ranks had one
        (np.min and np.max let NaN win, as the forms' min and max do)."""
        n = len(self.names)
        lo, hi = np.full(n, np.inf), np.full(n, -np.inf)
        ranks = np.zeros(n, dtype=np.int64)
        for schema, rows, sent in self.sent.values():
            own, defined = own_values(schema, np.stack(sent))
            lo[rows] = np.minimum(lo[rows], np.where(defined, own, np.inf).min(axis=0))
            hi[rows] = np.maximum(hi[rows], np.where(defined, own, -np.inf).max(axis=0))
            ranks[rows] += defined.sum(axis=0)
        return {name: (low, high, k) for name, low, high, k in zip(
            self.names, lo.tolist(), hi.tolist(), ranks.tolist(), strict=True) if k}

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
