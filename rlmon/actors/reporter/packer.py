"""Packing a closed step into its StepMessage, on the Reporter's sender thread.

The training thread hands over a :class:`~rlmon.actors.reporter.accumulator.RawStep`: the
accumulator, the tensor statistics in flight to the host, the ``record_many`` batches and the
raw timeline. The packer waits for the copy, merges everything into the accumulator, refuses
the statistics the catalog would refuse (the aggregator would refuse the whole step for one of
them), adds the hardware samples, converts every number to float in one numpy pass for the
columnar block and the spans to unix time. What it builds is one
:class:`~rlmon.service.contract.step_message.StepMessage`; how it travels is
:mod:`rlmon.actors.reporter.delivery`'s business.
"""

from __future__ import annotations

import math
import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlmon.actors.reporter.accumulator import (
    MEAN,
    PY_NUMBER,
    Accumulator,
    RawStep,
    RawTimeline,
    add_partial,
    add_samples,
    check_count,
    ranked_state,
)
from rlmon.actors.reporter.delivery import Stamp
from rlmon.actors.reporter.hardware import HardwareSampler
from rlmon.actors.reporter.sample_capture import DevicePick, build_items
from rlmon.actors.reporter.tally import Tally
from rlmon.service.contract.step_message import Columns, Schema, StepMessage, state_row
from rlmon.service.contract.timeline import Span, Timeline, attrs_of, clean_text
from rlmon.service.metrics import catalog
from rlmon.service.metrics.forms import BLOCK_WIDTH, FORMS, FormDef, form_of_keys, forms_text
from rlmon.service.metrics.partial import Partial
from rlmon.service.metrics.rank import Rank, World
from rlmon.service.metrics.spec import Form

__all__ = ["Origin", "StepPacker"]

# Spans read the monotonic clock; it is aligned to wall time once per process, so a span never
# jumps with the wall clock and spans of one process always line up with each other.
_WALL_OFFSET_NS = time.time_ns() - time.perf_counter_ns()


@dataclass(frozen=True, slots=True)
class Origin:
    """Who sends the steps: the run, role and rank of one Reporter, on which host and process."""

    run: str
    role: str
    rank: Rank
    world: World
    host: str = field(default_factory=lambda: clean_text(socket.gethostname()))
    pid: int = field(default_factory=os.getpid)


class _ColumnLayout:
    """The columnar block's schema for one set of plain metrics, kept while the set repeats."""

    __slots__ = ("count_cells", "key", "perm", "schema")

    def __init__(self, key: tuple[tuple[str, Form], ...]) -> None:
        self.key = key
        self.schema = Schema.build(dict(key))
        order = {name: i for i, (name, _) in enumerate(key)}
        self.perm = np.array([order[n] for n in self.schema.names], dtype=np.intp)
        self.count_cells = np.zeros((len(key), BLOCK_WIDTH), dtype=bool)
        for i, (_, form) in enumerate(key):
            self.count_cells[i, list(FORMS[form].counts)] = True


class StepPacker:
    """Builds a step's StepMessage from what ``end_step`` closed (sender thread).

    A statistic that does not fit its step (another form than the name has, a bad count, a
    sample capture whose ``ids``/``payload`` raised) is refused into ``tally``; a step that
    cannot be packed at all (a number too large for a float) raises.
    """

    def __init__(self, origin: Origin, tally: Tally, *,
                 redact: Callable[[str], str] | None = None,
                 hardware: HardwareSampler | None = None) -> None:
        self.origin = origin
        self.tally = tally
        self.redact = redact  # the privacy hook every sample payload passes
        self.hardware = hardware  # its samples join each step, the user's statistics first
        self._forms_ok: set[tuple[str, Form]] = set()  # (name, form) the catalog allows
        self._batch_forms: dict[str, FormDef] = {}  # a bare number's form, by metric name
        self._plain: dict[str, tuple[Form, bool]] = {}  # in the columnar block? by name
        self._layout: _ColumnLayout | None = None

    def __call__(self, raw: RawStep, stamp: Stamp) -> StepMessage:
        """The step's message, with the delivery's sequence number and counts."""
        acc = raw.acc
        if raw.tensors is not None or raw.batches:
            self._complete(raw)
        self._check_catalog_forms(acc)
        if self.hardware is not None:
            for name, (form, state) in self.hardware.take().items():
                acc.setdefault(name, [form, state, None, False, 0])  # the user's first
        return self.pack(raw.step, acc, raw.wall, stamp, raw.timeline)

    def pack(self, step: int, acc: Accumulator, wall: float, stamp: Stamp,
             timeline: RawTimeline | None = None) -> StepMessage:
        """An accumulator, complete, as a message: plain metrics in one numpy block."""
        plain: list[tuple[str, Form]] = []
        rows: list[tuple[float, ...]] = []  # converted and count-checked in one numpy pass
        other: dict[int, dict[str, Partial]] = {}
        for key, (form, state, rep, mb_mean, mb) in acc.items():
            if rep is None and not mb_mean and self._is_plain(key, form):
                plain.append((key, form))
                rows.append(state_row(form, state))
                continue
            ranked = FORMS[form].ranked
            state = ranked.check(state) if ranked is not None else tuple(map(float, state))
            for i in FORMS[form].counts:
                if not 0 <= state[i] < math.inf:
                    name = key[0] if mb_mean else key
                    raise ValueError(f"{name}: count must be finite and >= 0, got {state[i]!r}")
            name = key[0] if mb_mean else key
            other.setdefault(mb if mb_mean else 0, {})[name] = Partial(form, state, rep, mb_mean)
        columns = self._columns(plain, rows) if plain else None
        origin = self.origin
        return StepMessage(
            origin.run, origin.role, step, origin.rank, origin.world, stamp.seq, wall,
            columns, tuple(sorted(other.items(), key=lambda kv: kv[0])), stamp.dropped,
            stamp.started, timeline=self._timeline(timeline) if timeline is not None else None,
            refused=self.tally.rejected,
        )

    def _timeline(self, raw: RawTimeline) -> Timeline:
        """The step's timeline in unix ns, attributes normalized."""
        start, end, spans, cut = raw
        shift = _WALL_OFFSET_NS
        return Timeline(
            start + shift, end + shift,
            tuple(Span(clean_text(name), s + shift, e + shift, depth,
                       attrs_of(attrs) if attrs else ())
                  for name, s, e, depth, attrs in spans),
            cut, self.origin.host, self.origin.pid,
        )

    def _is_plain(self, name: str, form: Form) -> bool:
        """Whether the metric travels in the columnar block; cached by name (one dict get)."""
        known = self._plain.get(name)
        if known is None or known[0] is not form:
            spec = catalog.lookup(name)
            known = self._plain[name] = (form, Schema.plain(form) and not (
                spec is not None and spec.per_rank_spread
            ))
        return known[1]

    def _columns(self, plain: list[tuple[str, Form]], rows: list[tuple[float, ...]]) -> Columns:
        key = tuple(plain)
        layout = self._layout
        if layout is None or key != layout.key:
            layout = self._layout = _ColumnLayout(key)
        block = np.array(rows, dtype=np.float64)
        counts = block[layout.count_cells]
        if counts.size and not ((counts >= 0) & (counts < math.inf)).all():
            bad = layout.count_cells & ~((block >= 0) & (block < math.inf))
            row, col = np.argwhere(bad)[0]
            raise ValueError(f"{plain[row][0]}: count must be finite and >= 0, "
                             f"got {float(block[row, col])!r}")
        return Columns(layout.schema, block[layout.perm])

    def _check_catalog_forms(self, acc: Accumulator) -> None:
        """Refuse the statistics whose form the catalog does not give their name: the
        aggregator would refuse the whole step for one of them."""
        wrong: list[tuple[Any, str, str]] = []
        for key, entry in acc.items():
            name, form = (key[0] if entry[3] else key), entry[0]
            if (name, form) in self._forms_ok:
                continue
            error = catalog.form_error(name, form)
            if error is None:
                self._forms_ok.add((name, form))
            else:
                wrong.append((key, name, error))
        for key, _name, _error in wrong:
            del acc[key]
        if wrong:
            self.tally.refuse([name for _, name, _ in wrong], wrong[0][2])

    # -- merging what the training thread deferred ---------------------------------------------

    def _complete(self, raw: RawStep) -> None:
        """Merge a step's tensor statistics and record_many batches into its accumulator; a
        statistic that does not fit is refused and counted."""
        acc = raw.acc
        refused: list[tuple[str, str]] = []
        if raw.tensors is not None:
            vectors = raw.tensors.vectors()
            for stat, state in raw.tensors.read(vectors):
                try:
                    add_partial(acc, stat.name, stat.form, state, stat.replicated,
                                stat.minibatch_reduce, stat.minibatch)
                except ValueError as exc:  # recorded in another form by record() after it
                    refused.append((stat.name, str(exc)))
            for pick in raw.picks:
                self._complete_pick(acc, pick, vectors[pick.device], refused)
        for batch in raw.batches:
            self._merge_batch(acc, batch, refused)
        if refused:
            self.tally.refuse([name for name, _ in refused], refused[0][1])

    def _complete_pick(self, acc: Accumulator, pick: DevicePick, row: list[float],
                       refused: list[tuple[str, str]]) -> None:
        """A device sample capture's items: ids and payloads asked for the selected only."""
        try:
            items, cut = build_items(pick.picked(row), pick.ids, pick.payload, pick.prefix,
                                     pick.offset, self.redact)
            self.tally.payloads_cut += cut
            add_samples(acc, pick.name, pick.form, pick.k, items)
        except Exception as exc:  # the caller's ids/payload failed: never its text in a log
            refused.append((pick.name, f"ids or payload raised {type(exc).__name__}"))

    def _merge_batch(self, acc: Accumulator, batch: Mapping[str, Any],
                     refused: list[tuple[str, str]]) -> None:
        for name, stat in batch.items():
            if stat.__class__ is tuple and len(stat) == 2:  # (sum, count): the common case
                total, count = stat
                if count.__class__ in PY_NUMBER and not 0 <= count < math.inf:
                    refused.append((name, f"count must be finite and >= 0, got {count!r}"))
                    continue
                entry = acc.get(name)
                if entry is None:
                    acc[name] = [MEAN, stat, None, False, 0]
                    continue
                if entry[0] is MEAN:
                    old = entry[1]
                    entry[1] = (old[0] + total, old[1] + count)
                    continue
                form, state = MEAN, tuple(stat)
            else:
                try:
                    form, state = self._batch_state(name, stat)
                except (TypeError, ValueError) as exc:
                    refused.append((name, str(exc)))
                    continue
            try:
                add_partial(acc, name, form, state, None, None, 0)
            except ValueError as exc:
                refused.append((name, str(exc)))

    def _batch_state(self, name: str, stat: Any) -> tuple[Form, tuple[Any, ...]]:
        """The form and state of one record_many statistic other than a (sum, count) pair."""
        if isinstance(stat, Mapping):
            form = form_of_keys(frozenset(stat))
            if form is None:
                raise ValueError(f"{name}: give one statistic form ({forms_text()}), "
                                 f"got {', '.join(stat) or 'none'}")
            keyed = FORMS[form]
            if keyed.ranked is not None:  # {"k": 8, "top": [[score, id, payload?], ...]}
                state, cut = ranked_state(name, form, stat["k"], stat[keyed.ranked.key],
                                          self.redact)
                self.tally.payloads_cut += cut
                return form, state
            state = keyed.state(stat)
            for i in keyed.counts:
                check_count(name, state[i])
            return form, state
        if isinstance(stat, tuple | list):
            raise ValueError(f"{name}: a sequence must be a (sum, count) pair, got {stat!r}")
        spec = self._batch_forms.get(name)
        if spec is None:
            declared = catalog.lookup(name)
            spec = FORMS[declared.forms[0]] if declared is not None else FORMS[Form.VALUE]
            if spec.of_value is None:  # a form that cannot hold one value (sqsum)
                spec = FORMS[Form.VALUE]
            self._batch_forms[name] = spec
        of_value = spec.of_value
        assert of_value is not None
        return spec.form, of_value(stat)
