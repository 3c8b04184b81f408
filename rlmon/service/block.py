"""The aggregator's hot path: the core :class:`StepAssembler` plus a numpy merge of columnar blocks.

A step's columnar blocks are summed (min-ed, max-ed) per schema with numpy while the step is open
and folded into the core's metric pools once, just before the step finalizes; the rest of a message
goes through the core unchanged. Merging is in arrival order, as in the core, so the values are
bit-for-bit those of the core (``tests/test_aggregator_columnar.py``).
"""

from __future__ import annotations

import numpy as np

from rlmon.service import catalog
from rlmon.service.assembly import AddOutcome, Clock, StepAssembler
from rlmon.service.message import Schema, StepMessage, row_state
from rlmon.service.partial import MetricPool, Partial
from rlmon.service.rank import Rank
from rlmon.service.report import ContractError, Report
from rlmon.service.spec import Form
from rlmon.service.step import StepKey, StepRecord

__all__ = ["ColumnarAssembler", "StepBlock", "fold_block"]

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


class ColumnarAssembler(StepAssembler):
    """A :class:`StepAssembler` that also takes :class:`StepMessage` s."""

    def __init__(self, clock: Clock | None = None) -> None:
        super().__init__(clock)
        self.schemas: dict[int, Schema] = {}
        self.columns: dict[StepKey, StepBlock] = {}

    def _validate_schema(self, schema: Schema) -> Schema:
        known = self.schemas.get(schema.id)
        if known is not None:
            return known
        probe = Report("probe", "probe", 0, {
            n: Partial(f, (0.0, 0.0, 0.0)) for n, f in zip(schema.names, schema.forms, strict=True)
        })
        try:
            spread = [n for n in schema.names if (s := catalog.lookup(n)) and s.per_rank_spread]
            if spread:
                raise ContractError(
                    f"metrics.{spread[0]}", "keeps a per-rank spread; send it as a partial"
                )
            self._check_forms(probe)
        except ContractError:
            self.counters.rejected += 1
            raise
        for name, form in zip(schema.names, schema.forms, strict=True):
            self.forms.setdefault(name, form)
        self.schemas[schema.id] = schema
        return schema

    def add_message(self, msg: StepMessage) -> tuple[str, StepRecord | None]:
        """Fold one step message in (all or nothing); returns the outcome and a finished step."""
        key = (msg.run, msg.role, msg.step)
        if self.is_finalized(*key):
            self.counters.late += 1
            return AddOutcome.LATE, None
        try:
            self.check_tracked(*key)
        except ContractError:
            self.counters.rejected += 1
            raise
        state = self.open.get(key)
        if state is not None and (msg.rank, msg.seq) in state.seen:
            self.counters.duplicates += 1
            return AddOutcome.DUPLICATE, None
        if state is not None and msg.rank in state.finals:  # after its own final: late
            self.counters.late += 1
            return AddOutcome.LATE, None
        cols = msg.columns
        schema = self._validate_schema(cols.schema) if cols is not None else None
        acc = self.columns.get(key)
        slow_names = {n for _, p in msg.partials for n in p}
        if schema is not None:
            if slow_names & set(schema.names):
                self.counters.rejected += 1
                raise ContractError("metrics", "a metric is both columnar and a partial")
            if state is not None and (acc is None or (schema.id != acc.primary
                                      and schema.id not in acc.maps)):
                clash = state.pools.keys() & set(schema.names)
                if clash:
                    self.counters.rejected += 1
                    raise ContractError(
                        f"metrics.{min(clash)}",
                        f"options differ from earlier records of step {msg.step}",
                    )
        if acc is not None and slow_names & acc.index.keys():
            self.counters.rejected += 1
            raise ContractError(
                f"metrics.{min(slow_names & acc.index.keys())}",
                f"options differ from earlier records of step {msg.step}",
            )
        reports = [
            Report(msg.run, msg.role, msg.step, dict(p), msg.rank, msg.world, final=False,
                   minibatch=mb, time=msg.time)
            for mb, p in msg.partials
        ]
        marker = Report(msg.run, msg.role, msg.step, {}, msg.rank, msg.world, final=True,
                        seq=msg.seq, time=msg.time)
        # Validate every record against the open step before anything changes.
        try:
            for report in (*reports, marker):
                self._check_forms(report)
                if state is not None:
                    state.check(report)
        except ContractError:
            self.counters.rejected += 1  # every rejection counted once, the form's too
            raise
        if schema is not None and cols is not None:
            if acc is None:
                self.columns[key] = StepBlock(schema, cols.values)
            else:
                acc.merge(schema, cols.values)
            self.counters.partials += len(schema.names)
        for report in reports:
            super().add(report)
            self.counters.accepted -= 1  # one message counts once
        outcome, record = super().add(marker)
        return outcome, record

    def finalize(self, key: StepKey) -> StepRecord:
        acc = self.columns.pop(key, None)
        if acc is not None:
            fold_block(self.open[key].pools, acc)
        return super().finalize(key)


def fold_block(pools: dict[str, MetricPool], block: StepBlock) -> None:
    """Turn a step's accumulated rows into the core's metric pools (once per step)."""
    for name, form, row in zip(block.names, block.forms, block.data.tolist(), strict=True):
        pool = MetricPool(form, None, False)
        pool.add(_NO_RANK, 0, row_state(form, row))
        mine = pools.get(name)
        if mine is None:
            pools[name] = pool
        else:
            mine.merge(pool)
