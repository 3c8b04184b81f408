"""A step's accumulator, and the closed step the training thread hands to the sender thread.

The accumulator maps a metric (or ``(name, minibatch)`` for a per-mini-batch mean) to its
partial so far. The training thread merges what ``record`` and ``span`` give into it; after
``end_step`` the sender thread merges the step's tensor statistics, ``record_many`` batches and
sample captures into the same dict before packing it. The functions here are that merge, shared
by both threads (each on its own step's dict, never the same one at once).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from rlmon.actors.reporter.sample_capture import DevicePick, check_k, cut_payload, sample_id
from rlmon.actors.reporter.tensor_stats import StepTensors
from rlmon.service.contract.records import MAX_STEP
from rlmon.service.metrics.forms import FORMS, Merge
from rlmon.service.metrics.partial import ALL_AXES, combine
from rlmon.service.metrics.rank import AXES
from rlmon.service.metrics.spec import Form

__all__ = ["Accumulator", "RawStep", "Replicated", "add_partial"]

Replicated = Sequence[str] | Literal["all"] | None

MEAN = Form.MEAN  # a module global: enum attribute access is slow on the hot path
PY_NUMBER = (float, int)

# An accumulator entry: [form, state, replicated, minibatch_mean, minibatch].
Entry = list[Any]
Accumulator = dict[Any, Entry]
# A closed span as the training thread keeps it: (name, start, end, depth, attrs), monotonic ns.
RawSpan = tuple[str, int, int, int, dict[str, Any] | None]
# A step's timeline as end_step hands it on: (start, end, spans, spans cut), monotonic ns.
RawTimeline = tuple[int, int, list[RawSpan], int]


@dataclass(frozen=True, slots=True)
class RawStep:
    """A step as ``end_step`` closes it: not yet packed, merged or converted.

    ``tensors`` are its tensor statistics in flight to the host, ``batches`` its ``record_many``
    mappings and ``picks`` its device sample captures (their scores ride in the tensors' copy):
    all merged into ``acc`` off the training thread.
    """

    step: int
    acc: Accumulator
    wall: float  # unix seconds at end_step
    tensors: StepTensors | None
    batches: Sequence[Mapping[str, Any]]
    picks: Sequence[DevicePick]
    timeline: RawTimeline | None


def check_count(name: str, count: Any) -> None:
    """Reject a negative or non-finite Python count here; other number types at pack time."""
    if count.__class__ in PY_NUMBER and not 0 <= count < math.inf:
        raise ValueError(f"{name}: count must be finite and >= 0, got {count!r}")


def check_step(step: Any) -> int:
    try:
        value = operator.index(step)
    except TypeError:
        raise ValueError(f"step must be an integer, got {step!r}") from None
    if isinstance(step, bool) or not 0 <= value <= MAX_STEP:
        raise ValueError(f"step must be an integer in 0..{MAX_STEP}, got {step!r}")
    return value


def replicated_axes(value: Replicated) -> frozenset[str] | None:
    if value is None:
        return None
    if value == "all":
        return ALL_AXES
    axes = frozenset(value)
    unknown = axes - ALL_AXES
    if unknown:
        raise ValueError(f"replicated: unknown axis {sorted(unknown)[0]!r} (axes are {AXES})")
    return axes or None


def add_partial(
    acc: Accumulator, name: str, form: Form, state: tuple[Any, ...], replicated: Replicated,
    minibatch_reduce: str | None, minibatch: int,
) -> None:
    """Merge one partial into ``acc``; a name recorded in another form this step raises."""
    mb_mean = minibatch_reduce == "mean"
    if minibatch_reduce is not None and not mb_mean:
        raise ValueError(f'{name}: minibatch_reduce must be "mean" or None')
    key = (name, minibatch) if mb_mean else name
    entry = acc.get(key)
    if entry is None:
        rep = replicated_axes(replicated) if replicated is not None else (
            ALL_AXES if FORMS[form].replicated_by_default else None)
        acc[key] = [form, state, rep, mb_mean, minibatch]
        return
    if entry[0] is not form:
        raise ValueError(f"{name}: recorded as {entry[0].value!r} and now as {form.value!r}")
    entry[1] = combine(form, entry[1], state)


def add_numbers(acc: Accumulator, name: str, form: Form, numbers: Mapping[str, float],
                replicated: Replicated, minibatch_reduce: str | None, minibatch: int) -> None:
    """Add a tensor statistic given by form key (with its count) to the accumulator."""
    spec = FORMS[form]
    if numbers["count"] == 0 and spec.columnar is not Merge.ADD:
        return  # an extreme of no entries is nothing to report, not +-inf
    add_partial(acc, name, form, spec.state(numbers), replicated, minibatch_reduce, minibatch)


def add_samples(acc: Accumulator, name: str, form: Form, k: int, items: Sequence[Any]) -> None:
    """Merge ranked items (score, id, payload) into the best ``k`` of ``name``, one per id."""
    ranked = FORMS[form].ranked
    assert ranked is not None
    add_partial(acc, name, form, ranked.combine((k,), (k, *items)), None, None, 0)


def ranked_state(name: str, form: Form, k: Any, given: Iterable[Any],
                 redact: Callable[[str], str] | None) -> tuple[tuple[Any, ...], int]:
    """The best ``k`` of ``(score, id[, payload])`` items as a ranked state, and how many
    payloads were cut: ids made printable, payloads redacted and cut (only the kept ones)."""
    check_k(name, k)
    ranked = FORMS[form].ranked
    assert ranked is not None
    try:
        best = sorted(((float(item[0]), sample_id(item[1]),
                        item[2] if len(item) > 2 and item[2] else "") for item in given),
                      key=ranked.order)
    except (IndexError, TypeError) as exc:
        raise ValueError(f"{name}: items must be (score, id) or (score, id, payload): "
                         f"{type(exc).__name__}") from None
    kept: list[Any] = []
    seen: set[str] = set()
    cuts = 0
    for score, ident, payload in best:
        if ident in seen:
            continue
        seen.add(ident)
        if payload:
            text = redact(str(payload)) if redact is not None else str(payload)
            payload, cut = cut_payload(text)
            cuts += cut
        kept.append((score, ident, payload))
        if len(kept) == k:
            break
    return (k, *kept), cuts
