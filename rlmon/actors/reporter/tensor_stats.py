"""Masked tensor statistics: held by reference, reduced in a few batched launches, one copy a step.

``record_tensor`` launches nothing. It appends a tuple (the tensor, its version counter, the
statistic) to the list of its mask, found by identity with the previous call's mask (the common
case: a micro-batch's statistics share one) or by ``id``. A *fold* (``Reporter.end_micro_batch``,
``end_step``, or :data:`MAX_HELD_ELEMENTS` held) groups each mask's tensors by reduce mode and
dtype, and reduces all groups of the same reduce mode, dtype, shape, device and length together,
whatever their masks: one stack of the tensors, one stack of the masks, one ``where`` and one
float64 reduction per statistic, one count per set of masks (a step of 8 micro-batches x 25
statistics folded at ``end_step``: 11 ATen ops in all on an accelerator; on CPU fewer than
:data:`CPU_BATCH_ELEMENTS` elements are reduced together, one mask's at a time there: 57 ops, and
a multiply by the mask replaces the ``where`` while the sums are finite). It then releases the
references; the small float64 results stay on the device. ``end_step`` concatenates them per
device and copies them once to the host, non-blocking into pinned memory on CUDA; the sender
thread waits for that copy, never the training thread, and merges each statistic's numbers over
the step (by slices when every micro-batch recorded the same statistics in the same order).

Which statistics a reduce mode computes comes from its form's keys in
:data:`~rlmon.service.metrics.forms.FORMS` (``sum``, ``sqsum``, ``min``, ``max``, ``count``), so a form
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

from rlmon.service.metrics.forms import FORMS, Merge, State
from rlmon.service.metrics.spec import Form

__all__ = [
    "MAX_HELD_ELEMENTS",
    "REDUCE_FORMS",
    "TORCH_TYPES",
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
# On CPU, the elements reduced together at most (a few masks' tensors, or a part of one mask's):
# fewer than torch's grain size (32,768), so that each operation runs on the calling thread. One
# split over torch's threads waits for all of them, and on a machine whose cores other processes
# hold that is 10 - 190 ms a step (measured on a loaded 2-core box); the per-metric operations
# it replaces are each too small to be split. On an accelerator every batch is reduced at once:
# there the launches are the cost.
CPU_BATCH_ELEMENTS = (1 << 15) - 1


def check_reduce(reduce: str) -> Form:
    form = REDUCE_FORMS.get(reduce)
    if form is None:
        raise ValueError(f"reduce must be one of {sorted(REDUCE_FORMS)}, got {reduce!r}")
    return form


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

# Classes seen to be torch tensors: the Reporter's fast path checks a call's class against it.
TORCH_TYPES: set[type] = set()


def is_torch(x: Any) -> bool:
    cls = x.__class__
    if cls in TORCH_TYPES:
        return True
    if cls.__module__.startswith("torch"):
        TORCH_TYPES.add(cls)
        return True
    return False


@dataclass(frozen=True, slots=True, eq=False)
class TensorStat:
    """What a ``record_tensor`` call records: made once per name and reduce mode (the Reporter
    keeps it across steps) and shared by every tensor recorded under it. Compared and hashed by
    identity: the step's tensors of one statistic are merged by it on the sender thread."""

    name: str
    form: Form
    reduce: str
    replicated: Any = None
    minibatch_reduce: str | None = None
    minibatch: int = 0


# A held tensor: (values, its version counter when recorded or None, its statistic). A plain
# tuple: record_tensor builds one per call.
_Item = tuple[Any, int | None, TensorStat]


@dataclass(slots=True)
class _MaskHeld:
    """The tensors recorded with one mask object (or without a mask) since the last fold."""

    mask: Any
    version: int | None
    shape: Any  # the mask's torch.Size; None without a mask (each tensor has its own shape)
    numel: int
    scalar: bool  # a 0-d mask
    items: list[_Item] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Folded:
    """Statistics folded together: where their numbers lie in their device's vector.

    ``stats`` are ``groups`` runs of ``per_group`` statistics, one run per mask; a number of
    statistic ``i`` lies at ``start + i``; its count at ``count + i // per_group`` (or is
    ``count`` itself when ``host_count``: no mask).
    """

    device: Any
    stats: list[TensorStat]
    per_group: int
    count: float
    host_count: bool
    offsets: tuple[tuple[str, int | None], ...]  # (key, start); None: an extreme of no entries


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


# The statistics each reduce mode computes on the device, besides the count.
_KEYS: dict[str, tuple[str, ...]] = {
    reduce: ("sum",) if reduce == "seq_mean" else
    tuple(key for key in FORMS[form].keys if key != "count")
    for reduce, form in REDUCE_FORMS.items()
}
_UNSEEN = object()  # no call since the last fold
_NOT_HELD = _MaskHeld(None, None, None, 0, False)  # the last call's entry while _UNSEEN


class HeldTensors:
    """The training thread's side: references held per mask, folded into device results.

    A call (:meth:`hold`) appends a tuple to its mask's list; the mask's entry is found by
    identity with the previous call's mask, else by ``id``. The fold groups what each mask
    holds by reduce mode and dtype, then reduces every group of the same reduce mode, dtype,
    shape, device and length together, whatever their masks: one stack of the tensors, one
    stack of the masks, one ``where`` and one float64 reduction per statistic, one count per
    set of masks.
    """

    def __init__(self) -> None:
        self._groups: dict[int, _MaskHeld] = {}  # by id(mask); the entry keeps the mask alive
        self._mask: Any = _UNSEEN  # the last call's mask and its entry (most calls repeat it)
        self._held = _NOT_HELD
        self._vectors: dict[Any, _DeviceVector] = {}
        self._folded: list[_Folded] = []
        self._fills: dict[tuple[Any, ...], Any] = {}
        self.held_elements = 0

    def __bool__(self) -> bool:
        return bool(self._groups or self._folded or self._vectors)

    def attach(self, device: Any, piece: Any) -> int:
        """Put a 1-d float64 tensor computed elsewhere (sample capture) into this step's copy of
        its device; returns where it starts in that device's vector after the transfer."""
        return self._vector(device).add(piece, int(piece.shape[0]))

    def hold(self, stat: TensorStat, values: Any, mask: Any) -> int:
        """Hold one torch tensor (no launch; a detach when it requires grad); returns the
        elements held since the last fold. Raises on a mask of another shape, or a 0-d tensor
        for ``seq_mean``."""
        if values.requires_grad:
            values = values.detach()  # a view sharing the version counter; no kernel
        try:
            version = values._version
        except RuntimeError:  # an inference tensor has no version counter: it cannot be checked
            version = None
        held = self._held if mask is self._mask else self._holder(mask)
        shape = held.shape
        if shape is None:
            if stat.reduce == "seq_mean" and not values.ndim:
                raise ValueError(f"{stat.name}: seq_mean needs values with a token (last) axis")
            self.held_elements += values.numel()
        else:
            if values.shape != shape:
                raise ValueError(f"{stat.name}: mask shape {tuple(shape)} differs from values "
                                 f"{tuple(values.shape)}")
            if held.scalar and stat.reduce == "seq_mean":
                raise ValueError(f"{stat.name}: seq_mean needs values with a token (last) axis")
            self.held_elements += held.numel
        held.items.append((values, version, stat))
        return self.held_elements

    def _holder(self, mask: Any) -> _MaskHeld:
        held = self._groups.get(id(mask))
        if held is None:
            if mask is None:
                held = _MaskHeld(None, None, None, 0, False)
            else:
                shape = mask.shape
                held = _MaskHeld(mask, _version(mask), shape, mask.numel(), not shape)
            self._groups[id(mask)] = held
        self._mask, self._held = mask, held
        return held

    def fold(self) -> list[str]:
        """Reduce every held tensor on its device and release the references.

        Returns the names refused because a tensor (or its mask) changed in place after it was
        recorded.
        """
        groups, self._groups = self._groups, {}
        self._mask, self._held = _UNSEEN, _NOT_HELD  # the references go with the groups
        self.held_elements = 0
        refused: list[str] = []
        # (reduce, dtype, shape, device, length, masked) -> [(mask entry, tensors)]
        batches: dict[tuple[Any, ...], list[tuple[_MaskHeld, list[_Item]]]] = {}
        for held in groups.values():
            items = held.items
            if not items:
                continue
            mask = held.mask
            if mask is not None and held.version is not None and \
                    _version(mask) != held.version:
                refused.extend(stat.name for _, _, stat in items)
                continue
            reduce, dtype = items[0][2].reduce, items[0][0].dtype
            uniform = mask is not None
            live = []
            for item in items:
                values, version, stat = item
                if version is not None and values._version != version:
                    refused.append(stat.name)
                    continue
                if stat.reduce is not reduce or values.dtype is not dtype:
                    uniform = False
                live.append(item)
            if not live:
                continue
            if uniform:
                parts = [live]
            else:  # several reduce modes or dtypes with this mask, or no mask (any shapes)
                split: dict[tuple[Any, ...], list[_Item]] = {}
                for item in live:
                    values = item[0]
                    kind = (item[2].reduce, values.dtype) if mask is not None else \
                        (item[2].reduce, values.dtype, values.shape)
                    split.setdefault(kind, []).append(item)
                parts = list(split.values())
            for part in parts:
                values = part[0][0]
                shape = held.shape if mask is not None else values.shape
                device = values.device
                # on CPU no more than CPU_BATCH_ELEMENTS in one reduction (see there)
                size = len(part) if device.type != "cpu" else \
                    max(1, CPU_BATCH_ELEMENTS // max(1, math.prod(shape)))
                for at in range(0, len(part), size):
                    chunk = part[at:at + size]
                    key = (chunk[0][2].reduce, values.dtype, shape, device, len(chunk),
                           mask is None)
                    batches.setdefault(key, []).append((held, chunk))
        masks: dict[Any, Any] = {}  # per fold: bool masks on a device, stacked sets, counts
        for (reduce, _, shape, device, length, _), whole in batches.items():
            # on CPU a few masks at a time (see CPU_BATCH_ELEMENTS)
            step = len(whole) if device.type != "cpu" else \
                max(1, CPU_BATCH_ELEMENTS // max(1, length * math.prod(shape)))
            for at in range(0, len(whole), step):
                self._reduce_batch(reduce, tuple(shape), device, whole[at:at + step], masks)
        return refused

    def _reduce_batch(self, reduce: str, shape: tuple[int, ...], device: Any,
                      batch: list[tuple[_MaskHeld, list[_Item]]], masks: dict[Any, Any]) -> None:
        try:
            self._reduce(reduce, shape, device, batch, masks)
        except RuntimeError:
            # one mask's tensors on several devices: reduce each device's apart
            split_dev: dict[tuple[int, Any], tuple[_MaskHeld, list[_Item]]] = {}
            for held, part in batch:
                for item in part:
                    split_dev.setdefault((id(held), item[0].device), (held, []))[1].append(item)
            if len(split_dev) == len(batch):
                raise
            for (_, on), one in split_dev.items():
                self._reduce(reduce, shape, on, [one], masks)

    def _reduce(self, reduce: str, shape: tuple[int, ...], device: Any,
                batch: list[tuple[_MaskHeld, list[_Item]]], masks: dict[Any, Any]) -> None:
        """Reduce groups of tensors of one reduce mode, dtype, shape, device and length, each
        group with its mask, in one stack, one ``where`` and one reduction per statistic."""
        import torch

        f64 = torch.float64
        n_groups, per_group = len(batch), len(batch[0][1])
        x = torch.stack([item[0] for _, part in batch for item in part])  # (G*K, *shape)
        stats = [item[2] for _, part in batch for item in part]
        axes = shape or (1,)  # 0-d values: give them an axis to reduce over
        if not shape:
            x = x.view(-1, 1)
        masked = batch[0][0].mask is not None
        seq = reduce == "seq_mean"
        vector = self._vector(device)
        m: Any = None
        denominator: Any = None
        if masked:
            found = self._mask_set(batch, device, masks)
            m = found["m"]
            kind = "seq" if seq else "tok"
            if kind not in found:
                if seq:
                    tokens = m.sum(-1, dtype=f64)  # (G, *shape[:-1]) or shape[:-1] for G == 1
                    counts = torch.count_nonzero(tokens.reshape(n_groups, -1), dim=1)
                    found["denominator"] = tokens.clamp(min=1.0)
                else:
                    counts = m.reshape(n_groups, -1).sum(1, dtype=f64)
                found[kind] = vector.add(counts, n_groups)
            count: float = found[kind]
            denominator = found.get("denominator")
        elif seq:
            count = float(math.prod(shape[:-1]) if shape[-1] else 0)
            denominator = float(max(shape[-1], 1))
        else:
            count = float(math.prod(shape))
        if n_groups == 1:
            lead = 1  # x is (K, *axes) and the mask (*axes) broadcasts
        else:
            lead = 2  # x is (G, K, *axes), the masks (G, 1, *axes)
            x = x.view(n_groups, per_group, *axes)
            if masked:
                m = m.unsqueeze(1)
                if seq:
                    denominator = denominator.unsqueeze(1)
        dims = tuple(range(lead, lead + len(axes)))
        keys = _KEYS[reduce]
        if "sqsum" in keys and not x.dtype.is_floating_point:
            x = x.to(f64)  # the norm is defined for floating tensors only

        def additive(zeroed: Any) -> dict[str, Any]:
            """The sums the form needs of the tensors with their masked-out entries zeroed."""
            if seq:
                per_seq = zeroed.sum(-1, dtype=f64) / denominator
                return {"sum": per_seq.sum(dims[:-1]) if len(dims) > 1 else per_seq}
            out = {}
            if "sum" in keys:
                out["sum"] = zeroed.sum(dims, dtype=f64)
            if "sqsum" in keys:  # the norm, squared: float64 throughout, one reduction
                out["sqsum"] = torch.linalg.vector_norm(zeroed, dim=dims, dtype=f64).square()
            return out

        pieces: dict[str, Any] = {}
        if seq or "sum" in keys or "sqsum" in keys:
            if not masked:
                pieces = additive(x)
            elif device.type == "cpu":
                # On CPU a multiply by the mask costs a quarter of a where and gives the same
                # sums, unless a masked-out entry is inf or NaN (times 0: NaN). Only when a sum
                # is not finite, seen on the host (no device to wait for), are they taken again
                # with where.
                pieces = additive(x * m)
                if not all(math.isfinite(float(piece.sum())) for piece in pieces.values()):
                    pieces = additive(torch.where(m, x, self._fill(0, x)))
            else:
                pieces = additive(torch.where(m, x, self._fill(0, x)))
        for key in keys:
            if key in ("min", "max"):
                if math.prod(shape) == 0:
                    pieces[key] = None
                    continue
                src = torch.where(m, x, self._extreme_fill(key, x)) if masked else x
                pieces[key] = src.amin(dims) if key == "min" else src.amax(dims)
            elif key not in ("sum", "sqsum"):
                raise ValueError(f"no tensor reduction computes form key {key!r}")
        size = n_groups * per_group
        offsets = tuple(
            (key, None if piece is None else
             vector.add(piece if n_groups == 1 else piece.reshape(size), size))
            for key, piece in pieces.items())
        self._folded.append(_Folded(device, stats, per_group, count, not masked, offsets))

    def _mask_set(self, batch: list[tuple[_MaskHeld, list[_Item]]], device: Any,
                  masks: dict[Any, Any]) -> dict[str, Any]:
        """The batch's masks as one bool tensor on ``device`` ((G, *shape), or the one mask),
        with the counts made from them so far: made once per set of masks in a fold."""
        key = (tuple(id(held.mask) for held, _ in batch), device)
        found = masks.get(key)
        if found is None:
            bools = [self._bool_mask(held.mask, device, masks) for held, _ in batch]
            if len(bools) == 1:
                m = bools[0]
            else:
                import torch

                m = torch.stack(bools)
            if batch[0][0].scalar:
                m = m.view(len(bools), 1) if len(bools) > 1 else m.view(1)
            found = masks[key] = {"m": m}
        return found

    def _vector(self, device: Any) -> _DeviceVector:
        vector = self._vectors.get(device)
        if vector is None:
            vector = self._vectors[device] = _DeviceVector()
        return vector

    @staticmethod
    def _bool_mask(mask: Any, device: Any, cache: dict[Any, Any]) -> Any:
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

    def transfer(self) -> StepTensors | None:
        """End the step: one copy per device of every folded statistic; None when there is none.

        Fold first: held references are not transferred.
        """
        folded, self._folded = self._folded, []
        vectors, self._vectors = self._vectors, {}
        if not folded and not vectors:
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
        return StepTensors(folded, hosts)


@dataclass(frozen=True, slots=True)
class StepTensors:
    """One step's tensor statistics in flight to the host; read on the sender thread."""

    folded: list[_Folded]
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
             ) -> list[tuple[TensorStat, State]]:
        """Each statistic's state over the step, in its form's key order (``numbers``:
        :meth:`vectors`, when the caller already waited for them). The tensors recorded under
        one statistic are merged here, by form; an extreme of no entries is left out: nothing
        to report, not +-inf."""
        if numbers is None:
            numbers = self.vectors()
        merged: dict[TensorStat, State] = {}

        def add(states: list[tuple[TensorStat, State]]) -> None:
            for stat, state in states:
                known = merged.get(stat)
                merged[stat] = state if known is None else FORMS[stat.form].combine(known, state)

        # Folds whose every mask's group holds the same statistics in the same order (each
        # micro-batch recording the same metrics): merged a statistic at a time, by slices.
        run: list[_Folded] = []
        for folded in self.folded:
            if run and not _same_statistics(run[0], folded):
                add(_run_states(run, numbers))
                run = []
            k = folded.per_group
            if folded.stats == folded.stats[:k] * (len(folded.stats) // k):
                run.append(folded)
            else:
                add(_item_states(folded, numbers[folded.device]))
        if run:
            add(_run_states(run, numbers))
        return list(merged.items())


def _same_statistics(a: _Folded, b: _Folded) -> bool:
    k = a.per_group
    return b.per_group == k and b.device == a.device and b.stats[:k] == a.stats[:k]


def _run_states(run: list[_Folded], numbers: dict[Any, list[float]],
                ) -> list[tuple[TensorStat, State]]:
    """The states of folds holding the same statistics in every group, merged over them all."""
    per_group = run[0].per_group
    stats = run[0].stats[:per_group]
    spec = FORMS[stats[0].form]
    keys = [key for key in dict.fromkeys(spec.keys) if key != "count"]
    columns: dict[str, list[list[float]]] = {key: [[] for _ in stats] for key in keys}
    n = 0.0
    for folded in run:
        row = numbers[folded.device]
        groups = len(folded.stats) // per_group
        size = groups * per_group
        first = int(folded.count)
        n += folded.count * groups if folded.host_count else sum(row[first:first + groups])
        for key, start in folded.offsets:
            if start is None:  # no entries (an extreme of an empty shape)
                continue
            for k, column in enumerate(columns[key]):
                column.extend(row[start + k:start + size:per_group])
    if n == 0 and spec.columnar is not Merge.ADD:
        return []
    out = []
    for k, stat in enumerate(stats):
        state = []
        for key, merge in zip(spec.keys, spec.merge, strict=True):
            if key == "count":
                state.append(n)
            elif merge is Merge.ADD:
                state.append(sum(columns[key][k]))
            else:  # an empty group's extreme is the identity (+-inf): it changes nothing
                state.append(_extreme(columns[key][k], merge is Merge.MIN))
        out.append((stat, tuple(state)))
    return out


def _item_states(folded: _Folded, row: list[float]) -> list[tuple[TensorStat, State]]:
    """A fold's states one tensor at a time; an extreme of no entries is dropped."""
    spec = FORMS[folded.stats[0].form]
    additive = spec.columnar is Merge.ADD
    per_group, count, host_count = folded.per_group, folded.count, folded.host_count
    starts = dict(folded.offsets)
    # per form key: the index of its first number (-1: the count; None: NaN)
    plan = [-1 if key == "count" else starts[key] for key in spec.keys]
    nan = math.nan
    out = []
    for i, stat in enumerate(folded.stats):
        n = count if host_count else row[int(count) + i // per_group]
        if not additive and n == 0:
            continue
        out.append((stat, tuple(n if at == -1 else nan if at is None else row[at + i]
                                for at in plan)))
    return out


def _extreme(values: list[float], least: bool) -> float:
    """min (``least``) or max of the numbers; NaN wins, as the form's merge says."""
    out = values[0]
    for v in values:
        if v != v:
            return v
        if (v < out) if least else (v > out):
            out = v
    return out
