"""The statistic forms, each defined once: state layout, JSON keys, merge, domain, finalization.

A rank ships a metric as the mergeable state of one form (docs/design.md, "Ship sufficient
statistics, reduce once"). Everything that handles states derives from :data:`FORMS`: the scalar
merge and finalization (:mod:`rlmon.service.metrics.partial`), the contract parser and the domain checks
(:mod:`rlmon.service.contract.records`), the columnar block and its numpy merge
(:mod:`rlmon.service.contract.step_message`, :mod:`rlmon.service.aggregation.block`), the
Reporter's packing and the
framework relays. Adding a form is one entry here (plus its tests).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from rlmon.service.metrics.ranked_forms import Ranked
from rlmon.service.metrics.spec import Form

__all__ = [
    "BLOCK_WIDTH",
    "FORMS",
    "STAT_KEYS",
    "FormDef",
    "Merge",
    "State",
    "form_of_keys",
    "forms_text",
]

# The mergeable state of one partial: a tuple of floats laid out as its form's ``keys``.
State = tuple[Any, ...]  # floats, except a ranked form's (k, items...) (rlmon.service.metrics.ranked_forms)


class Merge(StrEnum):
    """How one slot of two states combines. Every one is associative and commutative."""

    ADD = "add"
    MIN = "min"  # NaN wins, whatever the order
    MAX = "max"


def _nan_min(a: float, b: float) -> float:
    # min() with NaN depends on argument order; NaN must win whatever the order.
    if a != a:
        return a
    if b != b:
        return b
    return a if a <= b else b


def _nan_max(a: float, b: float) -> float:
    if a != a:
        return a
    if b != b:
        return b
    return a if a >= b else b


def _merger(ops: tuple[Merge, ...]) -> Callable[[State, State], State]:
    """The merge of two states slot by slot, unrolled for the common layouts (a hot path)."""
    if ops == (Merge.ADD,):
        return lambda x, y: (x[0] + y[0],)
    if ops == (Merge.ADD, Merge.ADD):
        return lambda x, y: (x[0] + y[0], x[1] + y[1])
    if ops == (Merge.ADD, Merge.ADD, Merge.ADD):
        return lambda x, y: (x[0] + y[0], x[1] + y[1], x[2] + y[2])
    if ops == (Merge.MIN,):
        return lambda x, y: (_nan_min(x[0], y[0]),)
    if ops == (Merge.MAX,):
        return lambda x, y: (_nan_max(x[0], y[0]),)
    slot = {Merge.ADD: float.__add__, Merge.MIN: _nan_min, Merge.MAX: _nan_max}
    fns = tuple(slot[op] for op in ops)
    return lambda x, y: tuple(f(a, b) for f, a, b in zip(fns, x, y, strict=True))


def _mean(x: State) -> float | None:
    total, count = x
    if count == 0:
        # Nothing to average over is "absent", not zero; a non-finite sum still propagates.
        return None if math.isfinite(total) else total
    return total / count


def _first(x: State) -> float | None:
    return x[0]


def _root(x: State) -> float | None:
    return math.sqrt(x[0]) if not x[0] < 0 else math.nan


def _std(x: State) -> float | None:
    count, total, sqsum = x
    if count == 0:
        return None if math.isfinite(total) and math.isfinite(sqsum) else math.nan
    mean = total / count
    variance = sqsum / count - mean * mean
    return math.sqrt(max(variance, 0.0)) if variance == variance else math.nan


@dataclass(frozen=True, slots=True)
class FormDef:
    """One statistic form.

    ``keys`` names each state slot as the contract's JSON key (a key may fill several slots:
    ``value`` is both the lowest and the highest copy seen). ``counts`` are slots that must be
    finite and >= 0; ``nonnegative`` slots must be >= 0 (NaN passes and propagates). ``agree``:
    the copies merged must hold the same number (a value already global on every rank).
    ``of_value`` is the state of one already-reduced value (None: the form cannot hold one).
    ``ranked`` makes it a ranked form (:mod:`rlmon.service.metrics.ranked_forms`): its own merge, parse and
    checks replace the slot ones.
    """

    form: Form
    keys: tuple[str, ...]
    merge: tuple[Merge, ...]
    finalize: Callable[[State], float | None]
    counts: tuple[int, ...] = ()
    nonnegative: tuple[int, ...] = ()
    agree: bool = False
    replicated_by_default: bool = False
    of_value: Callable[[float], State] | None = None
    note: str = ""
    ranked: Ranked | None = None
    combine: Callable[[State, State], State] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        merge = self.ranked.combine if self.ranked is not None else _merger(self.merge)
        object.__setattr__(self, "combine", merge)

    @property
    def size(self) -> int:
        return len(self.keys)

    @property
    def key_set(self) -> frozenset[str]:
        return frozenset(self.keys)

    @property
    def columnar(self) -> Merge | None:
        """The block column group this form travels in (every slot merges alike), or None."""
        if self.ranked or self.agree or len(set(self.merge)) != 1 or self.size > BLOCK_WIDTH:
            return None
        return self.merge[0]

    def state(self, numbers: Mapping[str, float]) -> State:
        """The state holding ``numbers`` given by JSON key."""
        return tuple(numbers[key] for key in self.keys)

    def as_keys(self, state: State) -> dict[str, Any]:
        """The state by JSON key (a key filling several slots takes the first)."""
        if self.ranked is not None:
            return self.ranked.to_json(state)
        out: dict[str, Any] = {}
        for key, number in zip(self.keys, state, strict=True):
            out.setdefault(key, number)
        return out

    def describe(self) -> str:
        text = ",".join(dict.fromkeys(self.keys))
        return f"{text} ({self.note})" if self.note else text


_ADD2 = (Merge.ADD, Merge.ADD)

FORMS: dict[Form, FormDef] = {
    d.form: d
    for d in (
        FormDef(Form.MEAN, ("sum", "count"), _ADD2, _mean, counts=(1,),
                of_value=lambda v: (v, 1.0)),
        FormDef(Form.SUM, ("sum",), (Merge.ADD,), _first, of_value=lambda v: (v,)),
        FormDef(Form.MIN, ("min",), (Merge.MIN,), _first, of_value=lambda v: (v,)),
        FormDef(Form.MAX, ("max",), (Merge.MAX,), _first, of_value=lambda v: (v,)),
        FormDef(Form.SQSUM, ("sqsum",), (Merge.ADD,), _root, nonnegative=(0,)),
        FormDef(Form.VALUE, ("value", "value"), (Merge.MIN, Merge.MAX), _first, agree=True,
                replicated_by_default=True, of_value=lambda v: (v, v)),
        # One observation whose population std is the value: count 1, sum 0, sqsum v^2.
        FormDef(Form.MOMENTS, ("count", "sum", "sqsum"), (*_ADD2, Merge.ADD), _std,
                counts=(0,), nonnegative=(2,), of_value=lambda v: (1.0, 0.0, v * v), note="std"),
        *(FormDef(form, ("k", ranked.key), (), ranked.finalize, ranked=ranked,
                  note=f"the k {'highest' if ranked.highest else 'lowest'}-scored items")
          for form, ranked in ((Form.TOP, Ranked("top", highest=True)),
                               (Form.BOTTOM, Ranked("bottom", highest=False)))),
    )
}

# A columnar block row holds any columnar form's state, padded with zeros.
BLOCK_WIDTH = 3

_BY_KEYS: dict[frozenset[str], Form] = {d.key_set: f for f, d in FORMS.items()}
STAT_KEYS: frozenset[str] = frozenset().union(*_BY_KEYS)


def form_of_keys(keys: frozenset[str]) -> Form | None:
    """The form whose statistic keys are exactly ``keys`` (None: no form)."""
    return _BY_KEYS.get(keys)


def forms_text() -> str:
    """The forms by their keys, for error messages: ``sum+count, sum, ...``."""
    return ", ".join("+".join(dict.fromkeys(d.keys)) for d in FORMS.values())
