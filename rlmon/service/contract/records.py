"""The partial-report contract (docs/contract.md, JSON Lines version 1): parsing with exact errors.

A record is accepted or rejected as a whole. Errors name the field and the offending value so a
user can fix the producer; the caller counts them and goes on with the next record.

The parser is written by hand rather than with pydantic because the same checks run on the live
path for every rank and every step, and each message must name a field path such as
``metrics.actor/loss.count`` together with the value that broke it.
"""

from __future__ import annotations

import json
import math
import numbers
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlmon.service.metrics.forms import FORMS, STAT_KEYS, form_of_keys, forms_text
from rlmon.service.metrics.nonfinite import NONFINITE_VALUES
from rlmon.service.metrics.partial import ALL_AXES, Partial
from rlmon.service.metrics.rank import AXES, Rank, World
from rlmon.service.metrics.ranked_forms import RankedError
from rlmon.service.metrics.spec import Form

__all__ = [
    "MAX_AXIS",
    "MAX_LINE_BYTES",
    "MAX_METRICS",
    "MAX_ROLE",
    "MAX_STEP",
    "MAX_WORLD",
    "ContractError",
    "Report",
    "check_integer",
    "check_metric_name",
    "check_number",
    "check_partial",
    "check_rank",
    "check_role",
    "check_run",
    "check_state",
    "check_world",
    "parse_line",
    "parse_report",
    "show",
]

MAX_LINE_BYTES = 4 * 1024 * 1024
MAX_STEP = 2**53 - 1  # beyond this a JSON number no longer holds an exact integer
MAX_AXIS = 1 << 20  # no real run has a million ranks along one axis
MAX_WORLD = 1 << 22  # nor four million ranks in all
MAX_METRICS = 100_000
MAX_ROLE = 64  # a role names a Prometheus label value and a dashboard row
# Digits beyond which an integer literal is not converted at all: no field takes one (integer
# fields stop at 2^53, numbers at about 1.8e308), and Python refuses to convert more than 4300.
_MAX_DIGITS = 400
_RUN = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
_ROLE = re.compile(r"[a-z][a-z0-9_]*")
_KNOWN_FIELDS = frozenset(
    {"run", "role", "step", "rank", "world", "final", "seq", "minibatch", "time", "metrics"}
)
_PARTIAL_OPTIONS = frozenset({"replicated", "minibatch_reduce"})


class _HugeInt:
    """An integer literal of too many digits to convert, kept so the error can name its field."""

    __slots__ = ("digits",)

    def __init__(self, text: str) -> None:
        self.digits = len(text.lstrip("-"))

    def __repr__(self) -> str:
        return f"<an integer of {self.digits} digits>"


def _lenient_int(text: str) -> int | _HugeInt:
    return _HugeInt(text) if len(text) > _MAX_DIGITS else int(text)


class ContractError(ValueError):
    """A record breaks the contract; ``field`` is the dotted path of the culprit."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field


@dataclass(frozen=True, slots=True)
class Report:
    """One validated record: one rank's partials for one step (or one micro-batch of it)."""

    run: str
    role: str
    step: int
    metrics: Mapping[str, Partial]
    rank: Rank = Rank()  # noqa: RUF009 - immutable NamedTuple
    world: World = World()  # noqa: RUF009 - immutable NamedTuple
    final: bool = True
    seq: int | None = None
    minibatch: int = 0
    time: float | None = None


def show(value: Any) -> str:
    """A short printable form of any offending value (never raises, whatever the value)."""
    try:
        if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 1024:
            text = f"<an integer of about {int(value.bit_length() * 0.30103)} digits>"
        elif isinstance(value, float | _HugeInt):
            text = repr(value)
        else:
            text = json.dumps(value, default=repr)
    except Exception:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 80 else text[:77] + "..."


_show = show


def check_run(run: Any) -> str:
    """The run id of the contract, or ContractError naming ``run`` (shared by every producer path)."""
    if not isinstance(run, str) or not _RUN.fullmatch(run):
        raise ContractError("run", f"must be 1-128 chars of [A-Za-z0-9_.:-], got {_show(run)}")
    return run


def check_role(role: Any) -> str:
    if not isinstance(role, str) or len(role) > MAX_ROLE or not _ROLE.fullmatch(role):
        raise ContractError(
            "role", f"must match [a-z][a-z0-9_]* (at most {MAX_ROLE}), got {_show(role)}"
        )
    return role


def check_metric_name(name: Any) -> str:
    if not isinstance(name, str) or not name or len(name) > 200 or not name.isprintable():
        raise ContractError("metrics", f"bad metric name {_show(name)} (1-200 printable chars)")
    return name


def check_integer(value: Any, field: str, *, low: int = 0, high: int = MAX_STEP) -> int:
    """An integer field: an int (numpy's too) or an integral float (``3.0``) in [low, high]."""
    if type(value) is int and low <= value <= high:  # the common case, first
        return value
    if isinstance(value, _HugeInt):
        raise ContractError(field, f"must be between {low} and {high}, got {value!r}")
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Integral):
        if isinstance(value, float | np.floating) and math.isfinite(value) \
                and float(value).is_integer():
            value = int(value)
        else:
            raise ContractError(field, f"must be an integer, got {_show(value)}")
    value = int(value)
    if not low <= value <= high:
        raise ContractError(field, f"must be between {low} and {high}, got {_show(value)}")
    return value


_integer = check_integer


def check_number(value: Any, field: str) -> float:
    """A number field: a real number that fits a 64-bit float, or "NaN"/"Infinity"/"-Infinity"."""
    if type(value) is float:  # the common case, first
        return value
    if isinstance(value, str) and value in NONFINITE_VALUES:
        return NONFINITE_VALUES[value]
    if isinstance(value, _HugeInt):
        raise ContractError(field, f"{value!r} is too large for a 64-bit float")
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Real):
        raise ContractError(
            field, f'must be a number or "NaN"/"Infinity"/"-Infinity", got {_show(value)}'
        )
    try:
        return float(value)
    except OverflowError:
        raise ContractError(field, f"{_show(value)} is too large for a 64-bit float") from None


def _check_axes(value: Any, cls: type[Rank] | type[World], field: str, low: int) -> Any:
    """A Rank or World given as an object (that class, or any 4-tuple of axis values in
    ``low..MAX_AXIS``); the object itself when it is already exact."""
    if type(value) is cls and all(type(v) is int and low <= v <= MAX_AXIS for v in value):
        return value
    if not isinstance(value, tuple) or len(value) != len(AXES):
        raise ContractError(field, f"must be a {cls.__name__} (dp, cp, tp, pp), got "
                            f"{_show(value)}")
    return cls(*(check_integer(v, f"{field}.{axis}", low=low, high=MAX_AXIS)
                 for axis, v in zip(AXES, value, strict=True)))


def check_rank(rank: Any, field: str = "rank") -> Rank:
    """A rank given as an object (a :class:`Rank` or any 4-tuple of axis indices)."""
    checked: Rank = _check_axes(rank, Rank, field, 0)
    return checked


def check_world(world: Any, field: str = "world") -> World:
    """A world given as an object (a :class:`World` or any 4-tuple of axis sizes), size capped."""
    checked: World = _check_axes(world, World, field, 1)
    if checked.size > MAX_WORLD:
        raise ContractError(field, f"{checked.size} ranks in all exceed the limit of {MAX_WORLD}")
    return checked


def check_state(form: Form, state: Any, field: str, *, slot_fields: bool = True) -> tuple[float, ...]:
    """A partial's state for ``form``: the right count of numbers, in the form's domain (its
    counts finite and >= 0, its non-negative slots >= 0; see :mod:`rlmon.service.metrics.forms`), the one
    domain check of the contract, for parsed records and messages alike.

    An error names ``field.slot`` (``metrics.m.count``), or ``field`` with the slot in the message
    when ``slot_fields`` is false (a message's partial has no JSON keys)."""
    spec = FORMS[form]
    if spec.ranked is not None:
        try:
            return spec.ranked.check(state)
        except RankedError as exc:
            if slot_fields and exc.slot:
                raise ContractError(f"{field}.{exc.slot}", str(exc)) from None
            raise ContractError(field, f"{exc.slot} {exc}".strip()) from None
    if not isinstance(state, tuple | list) or len(state) != spec.size:
        raise ContractError(field, f"a {form.value!r} state must be {spec.size} numbers, "
                            f"got {_show(state)}")

    def culprit(slot: str, message: str) -> ContractError:
        if slot_fields:
            return ContractError(f"{field}.{slot}", message)
        return ContractError(field, f"{slot} {message}")

    values: list[float] = []
    for v, slot in zip(state, spec.keys, strict=True):
        try:
            values.append(check_number(v, f"{field}.{slot}"))
        except ContractError as exc:
            if slot_fields:
                raise
            raise culprit(slot, str(exc).split(": ", 1)[-1]) from None
    for i in spec.counts:
        if values[i] < 0:
            raise culprit(spec.keys[i], f"must be >= 0, got {_show(state[i])}")
        if not math.isfinite(values[i]):
            # a count is tokens or samples: NaN or Inf there is a producer bug, not a measurement
            raise culprit(spec.keys[i], f"must be a finite number, got {_show(state[i])}")
    for i in spec.nonnegative:
        if values[i] < 0:
            raise culprit(spec.keys[i], f"must be >= 0, got {_show(state[i])}")
    return tuple(values)


def _plain_partial(partial: Partial) -> bool:
    """Whether a partial is already exactly as :func:`check_partial` would return it."""
    form, state, replicated = partial.form, partial.state, partial.replicated
    spec = FORMS.get(form) if type(form) is Form else None
    if spec is None or spec.ranked is not None or type(state) is not tuple \
            or len(state) != spec.size:
        return False
    for v in state:
        if type(v) is not float:
            return False
    for i in spec.counts:
        if not 0.0 <= state[i] < math.inf:
            return False
    for i in spec.nonnegative:
        if state[i] < 0:
            return False
    return (replicated is None or (type(replicated) is frozenset and bool(replicated)
                                   and replicated <= ALL_AXES)) \
        and type(partial.minibatch_mean) is bool


def check_partial(partial: Any, field: str) -> Partial:
    """A :class:`Partial` built by any producer, checked as a parsed one is (and normalized)."""
    if type(partial) is Partial and _plain_partial(partial):  # the common case, cheaply
        return partial
    if not isinstance(partial, Partial):
        raise ContractError(field, f"must be a Partial, got {_show(partial)}")
    if not isinstance(partial.form, Form):
        raise ContractError(field, f"unknown form {_show(partial.form)}")
    state = check_state(partial.form, partial.state, field, slot_fields=False)
    replicated = partial.replicated
    if FORMS[partial.form].ranked is not None:
        if replicated is not None or partial.minibatch_mean is not False:
            raise ContractError(field, "a ranked form takes neither replicated nor "
                                "minibatch_reduce")
        return partial if state == partial.state else Partial(partial.form, state)
    if replicated is not None:
        if not isinstance(replicated, frozenset | set | list | tuple) or not all(
                isinstance(a, str) for a in replicated) or not set(replicated) <= ALL_AXES:
            raise ContractError(f"{field}.replicated",
                                f"must be a set of axes (dp, cp, tp, pp), got {_show(replicated)}")
        replicated = frozenset(replicated) or None
    if not isinstance(partial.minibatch_mean, bool):
        raise ContractError(f"{field}.minibatch_reduce",
                            f"must be true or false, got {_show(partial.minibatch_mean)}")
    if state == partial.state and replicated == partial.replicated and all(
            type(v) is float for v in partial.state):
        return partial
    return Partial(partial.form, state, replicated, partial.minibatch_mean)


def _axes(value: Any, field: str, *, default: int, low: int) -> tuple[int, ...]:
    if not isinstance(value, dict):
        raise ContractError(field, f"must be an object with keys dp/cp/tp/pp, got {_show(value)}")
    unknown = set(value) - set(AXES)
    if unknown:
        raise ContractError(field, f"unknown axis {sorted(unknown)[0]!r} (axes are dp, cp, tp, pp)")
    return tuple(
        _integer(value.get(axis, default), f"{field}.{axis}", low=low, high=MAX_AXIS)
        for axis in AXES
    )


def _replicated(value: Any, field: str) -> frozenset[str]:
    if value == "all":
        return ALL_AXES
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ContractError(field, f'must be "all" or a list of axes, got {_show(value)}')
    unknown = set(value) - ALL_AXES
    if unknown:
        raise ContractError(field, f"unknown axis {sorted(unknown)[0]!r} (axes are dp, cp, tp, pp)")
    return frozenset(value)


def _partial(value: Any, field: str) -> Partial:
    if not isinstance(value, dict):
        raise ContractError(field, f"a partial must be an object, got {_show(value)}")
    unknown = set(value) - STAT_KEYS - _PARTIAL_OPTIONS
    if unknown:
        raise ContractError(f"{field}.{sorted(unknown)[0]}", "unknown key in a partial")
    stats = frozenset(value) - _PARTIAL_OPTIONS
    form = form_of_keys(stats)
    if form is None:
        shown = ", ".join(sorted(stats)) or "none"
        raise ContractError(
            field, f"statistic keys {{{shown}}} are not one form ({forms_text()})")
    spec = FORMS[form]
    if spec.ranked is not None:
        options = sorted(set(value) & _PARTIAL_OPTIONS)
        if options:
            raise ContractError(f"{field}.{options[0]}", "not an option of a ranked form (its "
                                "items are unique by id: replicas merge as one)")
        try:
            state = spec.ranked.parse(value, field, check_number)
        except RankedError as exc:
            raise ContractError(f"{field}.{exc.slot}" if exc.slot else field, str(exc)) from None
        return Partial(form, state)
    numbers_ = {key: check_number(value[key], f"{field}.{key}") for key in stats}
    state = check_state(form, spec.state(numbers_), field)
    replicated: frozenset[str] | None
    if "replicated" in value:
        replicated = _replicated(value["replicated"], f"{field}.replicated") or None
    else:
        replicated = ALL_AXES if spec.replicated_by_default else None
    reduce = value.get("minibatch_reduce")
    if reduce not in (None, "mean"):
        raise ContractError(f"{field}.minibatch_reduce", f'must be "mean", got {_show(reduce)}')
    return Partial(form, state, replicated, reduce == "mean")


def parse_report(obj: Any) -> Report:
    """Validate one decoded record; raise :class:`ContractError` naming the field."""
    if not isinstance(obj, dict):
        raise ContractError("", f"a record must be a JSON object, got {_show(obj)}")
    unknown = set(obj) - _KNOWN_FIELDS
    if unknown:
        raise ContractError(sorted(unknown)[0], "unknown field")
    for required in ("run", "role", "step", "metrics"):
        if required not in obj:
            raise ContractError(required, "required field is missing")
    run, role = check_run(obj["run"]), check_role(obj["role"])
    step = _integer(obj["step"], "step")
    rank = Rank(*_axes(obj.get("rank", {}), "rank", default=0, low=0))
    world = check_world(World(*_axes(obj.get("world", {}), "world", default=1, low=1)))
    if not world.contains(rank):
        raise ContractError("rank", f"{rank.as_dict()} lies outside world {world.as_dict()}")
    final = obj.get("final", True)
    if not isinstance(final, bool):
        raise ContractError("final", f"must be true or false, got {_show(final)}")
    seq = obj.get("seq")
    if seq is not None:
        seq = _integer(seq, "seq")
    minibatch = _integer(obj.get("minibatch", 0), "minibatch", high=MAX_AXIS)
    time = obj.get("time")
    if time is not None:
        time = check_number(time, "time")
        if not math.isfinite(time) or time < 0:
            raise ContractError("time", f"must be unix seconds, got {_show(obj['time'])}")
    metrics = obj["metrics"]
    if not isinstance(metrics, dict):
        raise ContractError("metrics", f"must be an object of name: partial, got {_show(metrics)}")
    if len(metrics) > MAX_METRICS:
        raise ContractError("metrics", f"{len(metrics)} metrics exceed the limit of {MAX_METRICS}")
    partials: dict[str, Partial] = {}
    for name, partial in metrics.items():
        partials[check_metric_name(name)] = _partial(partial, f"metrics.{name}")
    return Report(run, role, step, partials, rank, world, final, seq, minibatch, time)


def _size_in_bytes(line: str | bytes) -> int:
    if isinstance(line, bytes):
        return len(line)
    if len(line) * 4 <= MAX_LINE_BYTES:  # UTF-8 takes at most 4 bytes a character
        return len(line)
    return len(line.encode("utf-8", "surrogatepass"))


def parse_line(line: str | bytes) -> Report:
    """Decode and validate one JSON line.

    The contract's limit is in bytes of UTF-8, whether the line comes as bytes or as text. Beside
    JSON numbers, the bare tokens ``NaN``, ``Infinity`` and ``-Infinity`` (what Python's and many
    other JSON writers emit for non-finite floats) are read like the strings of the contract. An
    integer literal too long to convert is kept as such, so the error names its field.
    """
    size = _size_in_bytes(line)
    if size > MAX_LINE_BYTES:
        raise ContractError("", f"line of {size} bytes exceeds {MAX_LINE_BYTES}")
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ContractError("", f"malformed JSON: {exc.msg} at column {exc.colno}") from None
    except RecursionError:
        raise ContractError("", "malformed JSON: nested too deeply") from None
    except ValueError:
        # An integer literal beyond Python's conversion limit: read again keeping such literals
        # unconverted, so parse_report names the field that holds one.
        try:
            obj = json.loads(line, parse_int=_lenient_int)
        except (ValueError, RecursionError) as exc:
            raise ContractError("", f"malformed JSON: {exc}") from None
    return parse_report(obj)
