"""The partial-report contract (DESIGN.md, JSON Lines version 1): parsing with exact errors.

A record is accepted or rejected as a whole. Errors name the field and the offending value so a
user can fix the producer; the caller counts them and goes on with the next record.

The parser is written by hand rather than with pydantic because the same checks run on the live
path for every rank and every step, and each message must name a field path such as
``metrics.actor/loss.count`` together with the value that broke it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rlmon.service.partial import ALL_AXES, Partial
from rlmon.service.rank import AXES, Rank, World
from rlmon.service.spec import Form

__all__ = [
    "MAX_LINE_BYTES",
    "MAX_STEP",
    "ContractError",
    "Report",
    "check_metric_name",
    "check_role",
    "check_run",
    "parse_line",
    "parse_report",
]

MAX_LINE_BYTES = 4 * 1024 * 1024
MAX_STEP = 2**53 - 1  # beyond this a JSON number no longer holds an exact integer
MAX_AXIS = 1 << 20  # no real run has a million ranks along one axis
MAX_WORLD = 1 << 22  # nor four million ranks in all
MAX_METRICS = 100_000
_RUN = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
_ROLE = re.compile(r"[a-z][a-z0-9_]*")
_KNOWN_FIELDS = frozenset(
    {"run", "role", "step", "rank", "world", "final", "seq", "minibatch", "time", "metrics"}
)
_PARTIAL_OPTIONS = frozenset({"replicated", "minibatch_reduce"})
# The statistic keys of a partial decide its form.
_FORMS: dict[frozenset[str], Form] = {
    frozenset({"sum", "count"}): Form.MEAN,
    frozenset({"sum"}): Form.SUM,
    frozenset({"min"}): Form.MIN,
    frozenset({"max"}): Form.MAX,
    frozenset({"sqsum"}): Form.SQSUM,
    frozenset({"value"}): Form.VALUE,
    frozenset({"count", "sum", "sqsum"}): Form.MOMENTS,
}
_STAT_KEYS = frozenset().union(*_FORMS)
_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


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


def _show(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, float) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def check_run(run: Any) -> str:
    """The run id of the contract, or ContractError naming ``run`` (shared by every producer path)."""
    if not isinstance(run, str) or not _RUN.fullmatch(run):
        raise ContractError("run", f"must be 1-128 chars of [A-Za-z0-9_.:-], got {_show(run)}")
    return run


def check_role(role: Any) -> str:
    if not isinstance(role, str) or not _ROLE.fullmatch(role) or len(role) > 64:
        raise ContractError("role", f"must match [a-z][a-z0-9_]* (at most 64), got {_show(role)}")
    return role


def check_metric_name(name: Any) -> str:
    if not isinstance(name, str) or not name or len(name) > 200 or not name.isprintable():
        raise ContractError("metrics", f"bad metric name {_show(name)} (1-200 printable chars)")
    return name


def _integer(value: Any, field: str, *, low: int = 0, high: int = MAX_STEP) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer() and math.isfinite(value):
            value = int(value)
        else:
            raise ContractError(field, f"must be an integer, got {_show(value)}")
    if not low <= value <= high:
        raise ContractError(field, f"must be between {low} and {high}, got {_show(value)}")
    return value


def _number(value: Any, field: str) -> float:
    if isinstance(value, str) and value in _NONFINITE:
        return _NONFINITE[value]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ContractError(
            field, f'must be a number or "NaN"/"Infinity"/"-Infinity", got {_show(value)}'
        )
    return float(value)


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
    unknown = set(value) - _STAT_KEYS - _PARTIAL_OPTIONS
    if unknown:
        raise ContractError(f"{field}.{sorted(unknown)[0]}", "unknown key in a partial")
    stats = frozenset(value) - _PARTIAL_OPTIONS
    form = _FORMS.get(stats)
    if form is None:
        shown = ", ".join(sorted(stats)) or "none"
        raise ContractError(
            field,
            f"statistic keys {{{shown}}} are not one form (sum+count, sum, min, max, sqsum, "
            "value, or count+sum+sqsum)",
        )
    numbers = {key: _number(value[key], f"{field}.{key}") for key in stats}
    for key in ("count", "sqsum"):
        if key in numbers and numbers[key] < 0:
            raise ContractError(f"{field}.{key}", f"must be >= 0, got {_show(value[key])}")
    if "count" in numbers and not math.isfinite(numbers["count"]):
        # a count is tokens or samples: NaN or Inf there is a producer bug, not a measurement
        raise ContractError(f"{field}.count", f"must be a finite number, got {_show(value['count'])}")
    state: tuple[float, ...]
    if form is Form.MEAN:
        state = (numbers["sum"], numbers["count"])
    elif form is Form.MOMENTS:
        state = (numbers["count"], numbers["sum"], numbers["sqsum"])
    elif form is Form.VALUE:
        state = (numbers["value"], numbers["value"])
    else:
        state = (numbers[next(iter(stats))],)
    replicated: frozenset[str] | None
    if "replicated" in value:
        replicated = _replicated(value["replicated"], f"{field}.replicated") or None
    else:
        replicated = ALL_AXES if form is Form.VALUE else None
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
    world = World(*_axes(obj.get("world", {}), "world", default=1, low=1))
    if world.size > MAX_WORLD:
        raise ContractError("world", f"{world.size} ranks in all exceed the limit of {MAX_WORLD}")
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
        time = _number(time, "time")
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


def parse_line(line: str | bytes) -> Report:
    """Decode and validate one JSON line."""
    if len(line) > MAX_LINE_BYTES:
        raise ContractError("", f"line of {len(line)} bytes exceeds {MAX_LINE_BYTES}")
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ContractError("", f"malformed JSON: {exc.msg} at column {exc.colno}") from None
    except RecursionError:
        raise ContractError("", "malformed JSON: nested too deeply") from None
    return parse_report(obj)
