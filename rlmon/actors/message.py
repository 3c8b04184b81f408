"""The one message a rank sends per step: a compact columnar block plus the partials that need more.

Most metrics are plain (not replicated, one pool over the step, no per-rank spread): they travel
as one ``(n, 3)`` float64 array whose rows are ordered additive forms first, then min, then max,
so the aggregator merges a whole message with three numpy slice operations instead of one Python
merge per metric. Everything else (replicated copies, ``minibatch_reduce``, values, metrics whose
per-rank spread is kept) travels as ordinary :class:`~rlmon.service.partial.Partial` s.

:meth:`StepMessage.reports` turns a message back into contract records; a test proves the
columnar merge gives exactly what the core gives on those records.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from rlmon.service.partial import Partial, State
from rlmon.service.rank import Rank, World
from rlmon.service.report import Report
from rlmon.service.spec import Form

__all__ = ["ADDITIVE", "Columns", "Schema", "StepMessage", "columns_from_states", "state_row"]

ADDITIVE = frozenset({Form.MEAN, Form.SUM, Form.SQSUM, Form.MOMENTS})
_GROUP = {Form.MEAN: 0, Form.SUM: 0, Form.SQSUM: 0, Form.MOMENTS: 0, Form.MIN: 1, Form.MAX: 2}


@dataclass(frozen=True, slots=True)
class Schema:
    """Names and forms of a columnar block, ordered additive, min, max.

    ``id`` is a digest of the names and forms, so the aggregator validates and slices a schema once
    and then recognises it by one integer.
    """

    names: tuple[str, ...]
    forms: tuple[Form, ...]
    id: int
    n_add: int
    n_min: int

    @classmethod
    def build(cls, forms_by_name: Mapping[str, Form]) -> Schema:
        items = sorted(forms_by_name.items(), key=lambda kv: (_GROUP[kv[1]], kv[0]))
        names = tuple(name for name, _ in items)
        forms = tuple(form for _, form in items)
        digest = hashlib.blake2b(digest_size=8)
        for name, form in items:
            digest.update(name.encode())
            digest.update(b"\0" + form.value.encode() + b"\0")
        n_add = sum(1 for f in forms if f in ADDITIVE)
        n_min = sum(1 for f in forms if f is Form.MIN)
        return cls(names, forms, int.from_bytes(digest.digest(), "little"), n_add, n_min)

    @staticmethod
    def plain(form: Form) -> bool:
        """Whether a form can travel in the columnar block (if not replicated nor mini-batch mean)."""
        return form in _GROUP


def state_row(form: Form, state: State) -> tuple[float, float, float]:
    """A core state as one row of the block (unused slots are 0)."""
    if form is Form.MEAN:
        return (state[0], state[1], 0.0)
    if form is Form.MOMENTS:
        return (state[0], state[1], state[2])
    return (state[0], 0.0, 0.0)


def row_state(form: Form, row: Sequence[float]) -> State:
    """The core state of one row of the block."""
    if form is Form.MEAN:
        return (float(row[0]), float(row[1]))
    if form is Form.MOMENTS:
        return (float(row[0]), float(row[1]), float(row[2]))
    return (float(row[0]),)


@dataclass(frozen=True, slots=True)
class Columns:
    schema: Schema
    values: np.ndarray  # (len(schema.names), 3) float64

    def partials(self) -> dict[str, Partial]:
        return {
            name: Partial(form, row_state(form, row))
            for name, form, row in zip(
                self.schema.names, self.schema.forms, self.values.tolist(), strict=True
            )
        }


def columns_from_states(states: Mapping[str, tuple[Form, State]]) -> Columns:
    schema = Schema.build({name: form for name, (form, _) in states.items()})
    values = np.array(
        [state_row(*states[name]) for name in schema.names], dtype=np.float64
    ).reshape(len(schema.names), 3)
    return Columns(schema, values)


@dataclass(frozen=True, slots=True)
class StepMessage:
    """One rank's step: what ``Reporter.end_step`` sends, and what a resend repeats verbatim.

    ``seq`` increases per message of one reporter, so a resend is recognised as a duplicate.
    ``dropped`` is the reporter's running count of messages it had to give up on. ``started`` is
    when the reporter was created (unix seconds): a message for an already finalized step from a
    reporter created after that stream last finalized a step comes from a rerun of the run.
    """

    run: str
    role: str
    step: int
    rank: Rank
    world: World
    seq: int
    time: float
    columns: Columns | None = None
    # Partials outside the columnar block, per mini-batch index.
    partials: tuple[tuple[int, Mapping[str, Partial]], ...] = field(default=())
    dropped: int = 0
    started: float = 0.0

    @property
    def n_partials(self) -> int:
        n = len(self.columns.schema.names) if self.columns is not None else 0
        return n + sum(len(p) for _, p in self.partials)

    def reports(self) -> list[Report]:
        """The same content as contract records (the last one final), for the core path."""
        groups: list[tuple[int, dict[str, Partial]]] = [
            (mb, dict(p)) for mb, p in self.partials
        ]
        if self.columns is not None:
            plain = self.columns.partials()
            for mb, p in groups:
                if mb == 0 and not (p.keys() & plain.keys()):
                    p.update(plain)
                    break
            else:
                groups.insert(0, (0, plain))
        if not groups:
            groups = [(0, {})]
        last = len(groups) - 1
        return [
            Report(
                self.run, self.role, self.step, metrics, self.rank, self.world,
                final=i == last, seq=self.seq * 1024 + i, minibatch=mb, time=self.time,
            )
            for i, (mb, metrics) in enumerate(groups)
        ]
