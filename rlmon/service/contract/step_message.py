"""The one message a rank sends per step: a compact columnar block plus the partials that need more.

Most metrics are plain (not replicated, one pool over the step, no per-rank spread): they travel
as one ``(n, BLOCK_WIDTH)`` float64 array of states (:mod:`rlmon.service.metrics.forms`) whose rows are
ordered additive forms first, then min, then max, so the aggregator merges a whole message with
three numpy slice operations instead of one Python merge per metric. Everything else (replicated
copies, ``minibatch_reduce``, values, metrics whose per-rank spread is kept) travels as ordinary
:class:`~rlmon.service.metrics.partial.Partial` s.

:meth:`StepMessage.reports` turns a message back into contract records; a test proves the
columnar merge gives exactly what the core gives on those records.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np

from rlmon.service.contract.heartbeat import Heartbeat
from rlmon.service.contract.records import (
    MAX_AXIS,
    MAX_METRICS,
    ContractError,
    Report,
    check_integer,
    check_metric_name,
    check_number,
    check_partial,
    check_rank,
    check_role,
    check_run,
    check_world,
    show,
)
from rlmon.service.contract.timeline import Timeline, check_timeline
from rlmon.service.metrics.forms import BLOCK_WIDTH, FORMS, Merge, State
from rlmon.service.metrics.partial import Partial
from rlmon.service.metrics.rank import Rank, World
from rlmon.service.metrics.spec import Form
from rlmon.service.recent import RecentMap

__all__ = [
    "Columns",
    "MessageChecks",
    "Schema",
    "StepMessage",
    "columns_from_states",
    "state_row",
]

# Block rows are grouped by how their form merges: additive first, then min, then max.
_GROUP_ORDER = {Merge.ADD: 0, Merge.MIN: 1, Merge.MAX: 2}
_GROUP = {form: _GROUP_ORDER[d.columnar] for form, d in FORMS.items() if d.columnar is not None}


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
        n_add = sum(1 for f in forms if _GROUP[f] == 0)
        n_min = sum(1 for f in forms if _GROUP[f] == 1)
        return cls(names, forms, int.from_bytes(digest.digest(), "little"), n_add, n_min)

    @staticmethod
    def plain(form: Form) -> bool:
        """Whether a form can travel in the columnar block (if not replicated nor mini-batch mean)."""
        return form in _GROUP


_PAD = {form: (0.0,) * (BLOCK_WIDTH - d.size) for form, d in FORMS.items()}


def state_row(form: Form, state: State) -> State:
    """A state as one row of the block (padded with zeros)."""
    return state + _PAD[form]


def row_state(form: Form, row: Sequence[float]) -> State:
    """The state of one row of the block."""
    return tuple(float(v) for v in row[:FORMS[form].size])


@dataclass(frozen=True, slots=True)
class Columns:
    schema: Schema
    values: np.ndarray  # (len(schema.names), BLOCK_WIDTH) float64

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
    ).reshape(len(schema.names), BLOCK_WIDTH)
    return Columns(schema, values)


@dataclass(frozen=True, slots=True)
class StepMessage:
    """One rank's step: what ``Reporter.end_step`` sends, and what a resend repeats verbatim.

    ``seq`` increases per message of one reporter, so a resend is recognised as a duplicate.
    ``dropped`` is the reporter's running count of messages it had to give up on. ``started`` is
    when the reporter was created (unix seconds): a message for an already finalized step from a
    reporter created after that stream last finalized a step comes from a rerun of the run.
    ``resend`` marks a message sent again because the aggregator restarted: one for a step
    already finalized was folded in before, so it is counted as resent, not late.
    ``timeline`` is the rank's step timeline (its spans; :mod:`rlmon.service.contract.timeline`).
    ``refused`` is the reporter's running count of statistics it refused before sending (the
    rest of their steps was sent). ``heartbeat`` is the sender's liveness report
    (:mod:`rlmon.service.contract.heartbeat`) when one was due as the message left.
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
    resend: bool = False
    timeline: Timeline | None = None
    refused: int = 0
    # the sender's latest heartbeat, riding along (checked apart: a bad one never costs the step)
    heartbeat: Heartbeat | None = None

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


class MessageChecks:
    """The contract's checks on a :class:`StepMessage` from any producer, not only a Reporter:
    the same checks (``rlmon.service.contract.records``) that replay makes on a parsed record, on the
    message's Python objects. Shared by the aggregator and the per-node collector.

    Calling it returns the message with its numbers normalized (integral floats and numpy
    integers to int, a numeric block to float64) or raises :class:`ContractError` naming the
    field; anything else a producer may have put in a field (a dict for a rank, None for the
    world, a string for a block) is a ContractError too, never another exception. Streams and
    schemas are checked once and remembered, so the per-message cost stays small.
    """

    def __init__(self) -> None:
        self.streams: RecentMap[tuple[str, str], bool] = RecentMap(MAX_KNOWN)
        # schema id -> (schema, (rows, cols) of counts, (rows, cols) of sums of squares)
        self.schemas: RecentMap[int, tuple[Schema, _Cells, _Cells]] = RecentMap(MAX_KNOWN)

    def __call__(self, msg: Any) -> StepMessage:
        try:
            return self._check(msg)
        except ContractError:
            raise
        except Exception as exc:
            raise ContractError("", f"malformed message ({type(exc).__name__})") from None

    def _check(self, msg: Any) -> StepMessage:
        if not isinstance(msg, StepMessage):
            raise ContractError("", f"must be a StepMessage, got {show(msg)}")
        stream = (msg.run, msg.role)
        if not (type(msg.run) is str and type(msg.role) is str and stream in self.streams):
            check_run(msg.run)
            check_role(msg.role)
            self.streams[stream] = True
        step = check_integer(msg.step, "step")
        rank, world = check_rank(msg.rank), check_world(msg.world)
        if not world.contains(rank):
            raise ContractError("rank", f"{rank.as_dict()} lies outside world {world.as_dict()}")
        seq = check_integer(msg.seq, "seq")
        sent = check_number(msg.time, "time")
        if not math.isfinite(sent) or sent < 0:
            raise ContractError("time", f"must be unix seconds, got {show(msg.time)}")
        started = check_number(msg.started, "started")
        if not isinstance(msg.resend, bool):
            raise ContractError("resend", f"must be true or false, got {show(msg.resend)}")
        dropped = check_integer(msg.dropped, "dropped")
        refused = check_integer(msg.refused, "refused")
        check_timeline(msg.timeline)
        columns = self._columns(msg.columns)
        partials = msg.partials
        if not isinstance(partials, tuple | list):
            raise ContractError("metrics", f"partials must be (minibatch, {{name: Partial}}) "
                                f"pairs, got {show(partials)}")
        total = len(columns.schema.names) if columns is not None else 0
        checked: list[tuple[int, Mapping[str, Partial]]] = []
        for item in partials:
            if not isinstance(item, tuple | list) or len(item) != 2 \
                    or not isinstance(item[1], Mapping):
                raise ContractError("metrics", f"partials must be (minibatch, {{name: Partial}})"
                                    f" pairs, got {show(item)}")
            total += len(item[1])
            if total > MAX_METRICS:
                break
            minibatch = check_integer(item[0], "minibatch", high=MAX_AXIS)
            group = {
                check_metric_name(name): check_partial(p, f"metrics.{name}")
                for name, p in item[1].items()
            }
            same = minibatch is item[0] and all(group[n] is p for n, p in item[1].items())
            checked.append((minibatch, item[1] if same else group))
        if total > MAX_METRICS:
            raise ContractError("metrics", f"more than {MAX_METRICS} metrics in one message "
                                f"(the limit)")
        # rebuild the message only where a check normalized a field (an int subclass, a list)
        normalized = {"step": step, "rank": rank, "world": world, "seq": seq, "time": sent,
                      "started": started, "dropped": dropped, "refused": refused,
                      "columns": columns}
        fields: dict[str, Any] = {
            name: value for name, value in normalized.items() if value is not getattr(msg, name)}
        if type(partials) is not tuple or any(
                c[0] is not o[0] or c[1] is not o[1] for c, o in zip(checked, partials, strict=True)):
            fields["partials"] = tuple(checked)
        return replace(msg, **fields) if fields else msg

    def _columns(self, cols: Any) -> Columns | None:
        if cols is None:
            return None
        if not isinstance(cols, Columns):
            raise ContractError("metrics", f"the columnar block must be Columns, got {show(cols)}")
        schema = cols.schema
        if not isinstance(schema, Schema):
            raise ContractError("metrics", f"a block's schema must be a Schema, got {show(schema)}")
        known = self.schemas.get(schema.id) if type(schema.id) is int else None
        if known is None or (known[0] is not schema and (
                known[0].names != schema.names or known[0].forms != schema.forms)):
            known = self._schema(schema)
        values = cols.values
        n = len(schema.names)
        if not isinstance(values, np.ndarray) or values.dtype.kind not in "fiu":
            raise ContractError("metrics", f"a block's values must be a numeric numpy array, "
                                f"got {show(type(values).__name__)}")
        if values.shape != (n, BLOCK_WIDTH):
            raise ContractError("metrics", f"block of shape {values.shape} for {n} metrics")
        if values.dtype != np.float64:
            values = values.astype(np.float64)
            cols = Columns(schema, values)
        counts, nonnegative = known[1], known[2]
        if len(counts[0]):
            cells = values[counts]
            if not (cells.min() >= 0 and cells.max() < math.inf):  # NaN fails both
                bad = ~(cells >= 0) | ~np.isfinite(cells)
                raise _cell_error(schema, counts, int(np.argmax(bad)), cells,
                                  "must be a finite number >= 0")
        if len(nonnegative[0]):
            cells = values[nonnegative]
            bad = cells < 0  # NaN is not: a NaN sum of squares propagates
            if bad.any():
                raise _cell_error(schema, nonnegative, int(np.argmax(bad)), cells, "must be >= 0")
        return cols

    def _schema(self, schema: Schema) -> tuple[Schema, _Cells, _Cells]:
        names, forms = schema.names, schema.forms
        if not isinstance(names, tuple) or not isinstance(forms, tuple) \
                or len(names) != len(forms):
            raise ContractError("metrics", "a block's schema needs as many forms as names")
        if len(names) > MAX_METRICS:
            raise ContractError("metrics", f"{len(names)} metrics exceed the limit of "
                                f"{MAX_METRICS}")
        for name, form in zip(names, forms, strict=True):
            check_metric_name(name)
            if not isinstance(form, Form) or not Schema.plain(form):
                raise ContractError(f"metrics.{name}",
                                    f"form {show(form)} cannot travel in a columnar block")
        if len(set(names)) != len(names):
            raise ContractError("metrics", "a block's schema names a metric twice")
        built = Schema.build(dict(zip(names, forms, strict=True)))
        if built != schema:
            raise ContractError("metrics", "a block's schema is not what Schema.build gives for "
                                "its names and forms (order, counts or id)")
        known = (schema, _cells(forms, "counts"), _cells(forms, "nonnegative"))
        self.schemas[schema.id] = known
        return known


_Cells = tuple[np.ndarray, np.ndarray]
MAX_KNOWN = 4096  # streams and schemas remembered as checked, per generation (RecentMap)


def _cells(forms: Sequence[Form], slots: Literal["counts", "nonnegative"]) -> _Cells:
    """(rows, columns) of a block's cells that are counts, or non-negative (a row is the state)."""
    pairs = [(i, column) for i, f in enumerate(forms) for column in getattr(FORMS[f], slots)]
    return (np.array([p[0] for p in pairs], dtype=np.intp),
            np.array([p[1] for p in pairs], dtype=np.intp))


def _cell_error(schema: Schema, where: _Cells, i: int, cells: np.ndarray, rule: str) -> ContractError:
    """The error naming the metric and the slot of the ``i``-th checked cell."""
    row, column = int(where[0][i]), int(where[1][i])
    slot = FORMS[schema.forms[row]].keys[column]
    return ContractError(f"metrics.{schema.names[row]}",
                         f"{slot} {rule}, got {show(float(cells[i]))}")
