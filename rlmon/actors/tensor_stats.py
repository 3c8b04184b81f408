"""Masked tensor statistics: held by reference, reduced in a few batched launches, one copy a step.

``record_tensor`` launches nothing. It keeps a reference to the tensor and its mask in a group
of tensors that share the mask, the reduce mode, the shape, the dtype and the device. A *fold*
(``Reporter.end_micro_batch``, ``end_step``, or :data:`MAX_HELD_ELEMENTS` held) reduces every
group in a few launches (stack, where, one float64 reduction per statistic; one count per mask)
and releases the references; the small float64 results stay on the device. ``end_step``
concatenates them per device and copies them once to the host, non-blocking into pinned memory
on CUDA; the sender thread waits for that copy, never the training thread.

Which statistics a reduce mode computes comes from its form's keys in
:data:`~rlmon.service.forms.FORMS` (``sum``, ``sqsum``, ``min``, ``max``, ``count``), so a form
the table gains needs one line in :data:`REDUCE_FORMS`. Sums accumulate in float64 whatever the
tensor's dtype (each element converted exactly, then added in float64); extremes are exact in the
tensor's dtype. numpy arrays are reduced at once, in float64, on the host.

A tensor is read when its group is folded, not when it is recorded: one modified in place in
between is detected by its version counter and its statistic is refused (counted, never sent
wrong). A tensor that requires grad is detached (a view, no launch) so that its autograd graph
is not held.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from rlmon.service.forms import FORMS
from rlmon.service.spec import Form

__all__ = [
    "MAX_HELD_ELEMENTS",
    "REDUCE_FORMS",
    "HeldTensors",
    "Reduce",
    "StepTensors",
    "TensorStat",
    "reduce_array",
]

Reduce = Literal["token_mean", "seq_mean", "sum", "min", "max", "sqsum", "std"]

REDUCE_FORMS: dict[str, Form] = {
    "token_mean": Form.MEAN,
    "seq_mean": Form.MEAN,  # sum of per-sequence (last axis) means, count of sequences
    "sum": Form.SUM,
    "min": Form.MIN,
    "max": Form.MAX,
    "sqsum": Form.SQSUM,
    "std": Form.MOMENTS,  # population std over the masked entries: count, sum, sqsum
}

# Held elements that trigger a fold inside record_tensor: bounds what references keep alive.
MAX_HELD_ELEMENTS = 1 << 26


def check_reduce(reduce: str) -> Form:
    form = REDUCE_FORMS.get(reduce)
    if form is None:
        raise ValueError(f"reduce must be one of {sorted(REDUCE_FORMS)}, got {reduce!r}")
    return form


def is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


# -- the host path (numpy): reduce at once -----------------------------------------------------


def reduce_array(values: Any, mask: Any, reduce: str) -> dict[str, float]:
    """Statistics of an array over the entries where ``mask`` is true, by form key, in float64.

    Always holds ``count``: tokens (sequences with at least one token for ``seq_mean``). This is
    also the float64 reference the torch path is tested against.
    """
    form = check_reduce(reduce)
    v = np.asarray(values, dtype=np.float64)
    m = np.ones(v.shape, dtype=bool) if mask is None else np.asarray(mask).astype(bool)
    if m.shape != v.shape:
        raise ValueError(f"mask shape {m.shape} differs from values {v.shape}")
    if reduce == "seq_mean":
        if v.ndim == 0:
            raise ValueError("seq_mean needs values with a token (last) axis")
        tokens = m.sum(-1, dtype=np.float64)
        per_seq = np.where(m, v, 0.0).sum(-1) / np.maximum(tokens, 1.0)
        return {"sum": float(per_seq.sum()), "count": float((tokens > 0).sum())}
    out = {"count": float(m.sum())}
    picked = v[m]
    for key in FORMS[form].keys:
        if key == "sum":
            out[key] = float(picked.sum())
        elif key == "sqsum":
            out[key] = float((picked * picked).sum())
        elif key in ("min", "max"):
            out[key] = float(getattr(picked, key)()) if picked.size else math.nan
    return out


# -- the device path (torch): hold, fold, transfer ---------------------------------------------


@dataclass(frozen=True, slots=True)
class TensorStat:
    """One ``record_tensor`` call's statistic: where each of its numbers lies after the transfer.

    ``slots`` maps each form key (and ``count``) to an index into its device's vector, or to a
    number already known on the host (a count without a mask).
    """

    name: str
    form: Form
    replicated: Any
    minibatch_reduce: str | None
    minibatch: int
    device: Any
    slots: tuple[tuple[str, int | float], ...]


@dataclass(slots=True)
class _Held:
    name: str
    form: Form
    replicated: Any
    minibatch_reduce: str | None
    minibatch: int
    values: Any
    version: int | None


@dataclass(slots=True)
class _Group:
    """Tensors reduced together: same mask object, reduce mode, shape, dtype and device."""

    reduce: str
    mask: Any
    mask_version: int | None
    shape: tuple[int, ...]
    items: list[_Held] = field(default_factory=list)


@dataclass(slots=True)
class _DeviceVector:
    """The pieces of one device's result vector, concatenated at the end of the step."""

    pieces: list[Any] = field(default_factory=list)
    size: int = 0

    def add(self, piece: Any, length: int) -> int:
        start = self.size
        self.pieces.append(piece)
        self.size += length
        return start


def _version(t: Any) -> int | None:
    try:
        return int(t._version)
    except RuntimeError:  # an inference tensor has no version counter: it cannot be checked
        return None


class HeldTensors:
    """The training thread's side: references grouped by mask, folded into device results."""

    def __init__(self) -> None:
        self._groups: dict[tuple[Any, ...], _Group] = {}
        self._vectors: dict[Any, _DeviceVector] = {}
        self._stats: list[TensorStat] = []
        self._fills: dict[tuple[Any, ...], Any] = {}
        self.held_elements = 0

    def __bool__(self) -> bool:
        return bool(self._groups or self._stats or self._vectors)

    def attach(self, device: Any, piece: Any) -> int:
        """Put a 1-d float64 tensor computed elsewhere (sample capture) into this step's copy of
        its device; returns where it starts in that device's vector after the transfer."""
        return self._vector(device).add(piece, int(piece.shape[0]))

    def add(self, name: str, form: Form, values: Any, mask: Any, reduce: str,
            replicated: Any, minibatch_reduce: str | None, minibatch: int) -> None:
        """Hold one tensor (no launch; a detach when it requires grad)."""
        shape = tuple(values.shape)
        if mask is not None and tuple(mask.shape) != shape:
            raise ValueError(f"{name}: mask shape {tuple(mask.shape)} differs from values {shape}")
        if reduce == "seq_mean" and not shape:
            raise ValueError(f"{name}: seq_mean needs values with a token (last) axis")
        if values.requires_grad:
            values = values.detach()  # a view sharing the version counter; no kernel
        key = (id(mask), reduce, values.dtype, shape, values.device)
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = _Group(
                reduce, mask, None if mask is None else _version(mask), shape)
        group.items.append(_Held(name, form, replicated, minibatch_reduce, minibatch, values,
                                 _version(values)))
        self.held_elements += math.prod(shape)

    def fold(self) -> list[str]:
        """Reduce every held group on its device and release the references.

        Returns the names refused because a tensor (or its mask) changed in place after it was
        recorded.
        """
        groups, self._groups = self._groups, {}
        self.held_elements = 0
        refused: list[str] = []
        folded: list[tuple[_Group, Any, list[_Held]]] = []
        for group in groups.values():
            mask_changed = group.mask is not None and group.mask_version is not None and \
                _version(group.mask) != group.mask_version
            live = []
            for held in group.items:
                if mask_changed or (held.version is not None
                                    and _version(held.values) != held.version):
                    refused.append(held.name)
                else:
                    live.append(held)
            if live:
                folded.append((group, live[0].values.device, live))
        if not folded:
            return refused
        import torch

        # One count per (mask, device, kind): a host number without a mask, else a device
        # scalar; a device's scalars are stacked into one piece.
        host_counts: dict[tuple[Any, ...], float] = {}
        device_counts: dict[tuple[Any, ...], int] = {}  # index into its device's scalars
        scalars: dict[Any, list[Any]] = {}
        mask_on: dict[tuple[int, Any], Any] = {}
        seq_tokens: dict[tuple[int, Any], Any] = {}
        for group, device, _ in folded:
            ckey = self._count_key(group, device)
            if ckey in host_counts or ckey in device_counts:
                continue
            mb = self._bool_mask(group.mask, device, mask_on)
            shape = group.shape
            if mb is None:
                host_counts[ckey] = float(
                    math.prod(shape) if ckey[2] == "tok"
                    else (math.prod(shape[:-1]) if shape[-1] else 0))
                continue
            if ckey[2] == "seq":
                tokens = mb.sum(-1, dtype=torch.float64)
                seq_tokens[(id(group.mask), device)] = tokens.clamp(min=1.0)
                count = torch.count_nonzero(tokens)
            else:
                count = mb.sum(dtype=torch.float64)
            on_device = scalars.setdefault(device, [])
            device_counts[ckey] = len(on_device)
            on_device.append(count)
        count_base = {device: self._vector(device).add(torch.stack(found), len(found))
                      for device, found in scalars.items()}
        for group, device, live in folded:
            ckey = self._count_key(group, device)
            count_slot: int | float = host_counts[ckey] if ckey in host_counts \
                else count_base[device] + device_counts[ckey]
            mb = self._bool_mask(group.mask, device, mask_on)
            pieces = self._reduce_group(group, live, mb, seq_tokens.get((id(group.mask), device)))
            vector = self._vector(device)
            offsets = {key: None if piece is None else vector.add(piece, len(live))
                       for key, piece in pieces.items()}
            for i, held in enumerate(live):
                slots: list[tuple[str, int | float]] = [("count", count_slot)]
                for key, start in offsets.items():
                    slots.append((key, math.nan if start is None else start + i))
                self._stats.append(TensorStat(held.name, held.form, held.replicated,
                                              held.minibatch_reduce, held.minibatch, device,
                                              tuple(slots)))
        return refused

    @staticmethod
    def _count_key(group: _Group, device: Any) -> tuple[Any, ...]:
        kind = "seq" if group.reduce == "seq_mean" else "tok"
        return (id(group.mask), device, kind, group.shape if group.mask is None else None)

    def _vector(self, device: Any) -> _DeviceVector:
        vector = self._vectors.get(device)
        if vector is None:
            vector = self._vectors[device] = _DeviceVector()
        return vector

    @staticmethod
    def _bool_mask(mask: Any, device: Any, cache: dict[tuple[int, Any], Any]) -> Any:
        if mask is None:
            return None
        key = (id(mask), device)
        mb = cache.get(key)
        if mb is None:
            import torch

            mb = mask if mask.dtype == torch.bool else mask.bool()
            if mb.device != device:
                mb = mb.to(device)
            cache[key] = mb
        return mb

    def _fill(self, value: float | bool | int, like: Any) -> Any:
        """A 0-d fill tensor for ``where``, made once per (value, dtype, device)."""
        key = (value, like.dtype, like.device)
        fill = self._fills.get(key)
        if fill is None:
            import torch

            fill = self._fills[key] = torch.tensor(value, dtype=like.dtype, device=like.device)
        return fill

    def _extreme_fill(self, key: str, x: Any) -> Any:
        """The identity of min (``key`` "min") or max for the tensor's dtype."""
        import torch

        if x.dtype == torch.bool:
            return self._fill(key == "min", x)
        if x.dtype.is_floating_point:
            return self._fill(math.inf if key == "min" else -math.inf, x)
        info = torch.iinfo(x.dtype)
        return self._fill(info.max if key == "min" else info.min, x)

    def _reduce_group(self, group: _Group, live: list[_Held], mb: Any,
                      seq_denominator: Any) -> dict[str, Any]:
        """One (K,) piece per statistic the form needs (None: an extreme of no entries)."""
        import torch

        f64 = torch.float64
        x = torch.stack([held.values for held in live])
        if x.ndim == 1:  # 0-d values: give them an axis to reduce over
            x = x.unsqueeze(1)
        dims = tuple(range(1, x.ndim))
        keys = [key for key in FORMS[live[0].form].keys if key != "count"]
        if "sqsum" in keys and not x.dtype.is_floating_point:
            x = x.to(f64)  # the norm is defined for floating tensors only
        if group.reduce == "seq_mean":
            zeroed = x if mb is None else torch.where(mb, x, self._fill(0, x))
            per_seq = zeroed.sum(-1, dtype=f64)
            per_seq = per_seq / (seq_denominator if mb is not None
                                 else float(max(group.shape[-1], 1)))
            stat = per_seq.sum(tuple(range(1, per_seq.ndim))) if per_seq.ndim > 1 else per_seq
            return {"sum": stat}
        out: dict[str, Any] = {}
        zeroed = None
        for key in keys:
            if key in ("sum", "sqsum"):
                if zeroed is None:
                    zeroed = x if mb is None else torch.where(mb, x, self._fill(0, x))
                if key == "sum":
                    out[key] = zeroed.sum(dims, dtype=f64)
                else:  # the norm, squared: float64 throughout, one reduction
                    out[key] = torch.linalg.vector_norm(zeroed, dim=dims, dtype=f64).square()
            elif key in ("min", "max"):
                if math.prod(group.shape) == 0:
                    out[key] = None
                    continue
                src = x if mb is None else torch.where(mb, x, self._extreme_fill(key, x))
                out[key] = src.amin(dims) if key == "min" else src.amax(dims)
            else:
                raise ValueError(f"no tensor reduction computes form key {key!r}")
        return out

    def transfer(self) -> StepTensors | None:
        """End the step: one copy per device of every folded statistic; None when there is none.

        Fold first: held references are not transferred.
        """
        stats, self._stats = self._stats, []
        vectors, self._vectors = self._vectors, {}
        if not stats and not vectors:
            return None
        import torch

        hosts: dict[Any, tuple[Any, Any]] = {}
        for device, vector in vectors.items():
            joined = torch.cat(vector.pieces) if len(vector.pieces) > 1 else vector.pieces[0]
            if joined.dtype != torch.float64:
                joined = joined.to(torch.float64)
            if device.type == "cpu":
                hosts[device] = (joined, None)  # already host memory, and a copy of its own
            elif device.type == "cuda":
                host = torch.empty(joined.shape, dtype=torch.float64, pin_memory=True)
                host.copy_(joined, non_blocking=True)
                done = torch.cuda.Event()
                done.record(torch.cuda.current_stream(device))
                hosts[device] = (host, done)
            else:
                hosts[device] = (joined.to("cpu"), None)
        return StepTensors(stats, hosts)


@dataclass(frozen=True, slots=True)
class StepTensors:
    """One step's tensor statistics in flight to the host; read on the sender thread."""

    stats: list[TensorStat]
    hosts: dict[Any, tuple[Any, Any]]  # device -> (host tensor, CUDA event or None)

    @property
    def transfers(self) -> int:
        return len(self.hosts)

    def vectors(self) -> dict[Any, list[float]]:
        """Wait for the copies (the sender thread's wait, not the training thread's); each
        device's vector as host numbers."""
        numbers: dict[Any, list[float]] = {}
        for device, (host, done) in self.hosts.items():
            if done is not None:
                done.synchronize()
            numbers[device] = host.tolist()
        return numbers

    def read(self, numbers: dict[Any, list[float]] | None = None,
             ) -> list[tuple[TensorStat, dict[str, float]]]:
        """The numbers of each statistic by form key (``numbers``: :meth:`vectors`, when the
        caller already waited for them)."""
        if numbers is None:
            numbers = self.vectors()
        out = []
        for stat in self.stats:
            row = numbers[stat.device]
            out.append((stat, {key: ref if isinstance(ref, float) else row[ref]
                               for key, ref in stat.slots}))
        return out

