"""The aggregator's hot path: the core :class:`StepAssembler` plus a numpy merge of columnar blocks.

A step's columnar blocks are summed (min-ed, max-ed) per schema with numpy while the step is open
and folded into the core's metric pools once, just before the step finalizes; the rest of a message
goes through the core unchanged. Merging is in arrival order, as in the core, so the values are
bit-for-bit those of the core (``tests/test_aggregator_columnar.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rlmon.actors.message import Schema, StepMessage, row_state
from rlmon.service import catalog
from rlmon.service.assembly import AddOutcome, Clock, StepAssembler
from rlmon.service.partial import MetricPool, Partial
from rlmon.service.rank import Rank
from rlmon.service.report import ContractError, Report
from rlmon.service.step import StepKey, StepRecord

__all__ = ["ColumnarAssembler", "fold_blocks", "merge_block"]

_NO_RANK = Rank()


@dataclass(slots=True)
class _Open:
    """Columnar accumulators of one open step, per schema id."""

    blocks: dict[int, np.ndarray] = field(default_factory=dict)
    names: set[str] = field(default_factory=set)


class ColumnarAssembler(StepAssembler):
    """A :class:`StepAssembler` that also takes :class:`StepMessage` s."""

    def __init__(self, clock: Clock | None = None) -> None:
        super().__init__(clock)
        self.schemas: dict[int, Schema] = {}
        self.columns: dict[StepKey, _Open] = {}

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
        state = self.open.get(key)
        if state is not None and (msg.rank, msg.seq) in state.seen:
            self.counters.duplicates += 1
            return AddOutcome.DUPLICATE, None
        cols = msg.columns
        schema = self._validate_schema(cols.schema) if cols is not None else None
        acc = self.columns.get(key)
        slow_names = {n for _, p in msg.partials for n in p}
        if schema is not None:
            if slow_names & set(schema.names):
                self.counters.rejected += 1
                raise ContractError("metrics", "a metric is both columnar and a partial")
            if state is not None and schema.id not in (acc.blocks if acc else ()):
                clash = state.pools.keys() & set(schema.names)
                if clash:
                    self.counters.rejected += 1
                    raise ContractError(
                        f"metrics.{min(clash)}",
                        f"options differ from earlier records of step {msg.step}",
                    )
        if acc is not None and slow_names & acc.names:
            self.counters.rejected += 1
            raise ContractError(
                f"metrics.{min(slow_names & acc.names)}",
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
        for report in (*reports, marker):
            self._check_forms(report)
            if state is not None:
                try:
                    state.check(report)
                except ContractError:
                    self.counters.rejected += 1
                    raise
        if schema is not None and cols is not None:
            if acc is None:
                acc = self.columns[key] = _Open()
            merge_block(acc.blocks, acc.names, schema, cols.values)
            self.counters.partials += len(schema.names)
        for report in reports:
            super().add(report)
            self.counters.accepted -= 1  # one message counts once
        outcome, record = super().add(marker)
        return outcome, record

    def finalize(self, key: StepKey) -> StepRecord:
        acc = self.columns.pop(key, None)
        if acc is not None:
            fold_blocks(self.open[key].pools, self.schemas, acc.blocks)
        return super().finalize(key)


def merge_block(
    blocks: dict[int, np.ndarray], names: set[str], schema: Schema, values: np.ndarray
) -> None:
    """Fold one columnar block into a step's accumulators: three slice operations."""
    block = blocks.get(schema.id)
    if block is None:
        blocks[schema.id] = np.array(values, dtype=np.float64, copy=True)
        names.update(schema.names)
        return
    a, b = schema.n_add, schema.n_add + schema.n_min
    block[:a] += values[:a]
    np.minimum(block[a:b], values[a:b], out=block[a:b])  # NaN wins, as in the core
    np.maximum(block[b:], values[b:], out=block[b:])


def fold_blocks(
    pools: dict[str, MetricPool], schemas: dict[int, Schema], blocks: dict[int, np.ndarray]
) -> None:
    """Turn accumulated blocks into the core's metric pools (once per step)."""
    for schema_id, block in blocks.items():
        schema = schemas[schema_id]
        for name, form, row in zip(schema.names, schema.forms, block.tolist(), strict=True):
            pool = MetricPool(form, None, False)
            pool.add(_NO_RANK, 0, row_state(form, row))
            mine = pools.get(name)
            if mine is None:
                pools[name] = pool
            else:
                mine.merge(pool)
