"""Masked tensor statistics computed on the tensor's own device, fetched in one transfer.

Each ``record_tensor`` call leaves a two-element device vector (statistic, count) pending; at the
end of the step :func:`fetch` stacks every pending vector of a device and moves them to the host
with a single copy, so a step costs one device-to-host synchronisation however many tensors it
recorded. numpy arrays take the same path without a device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from rlmon.service.spec import Form

__all__ = ["REDUCE_FORMS", "Pending", "Reduce", "fetch", "reduce_tensor"]

Reduce = Literal["token_mean", "seq_mean", "sum", "min", "max", "sqsum"]

REDUCE_FORMS: dict[str, Form] = {
    "token_mean": Form.MEAN,
    "seq_mean": Form.MEAN,
    "sum": Form.SUM,
    "min": Form.MIN,
    "max": Form.MAX,
    "sqsum": Form.SQSUM,
}


@dataclass(frozen=True, slots=True)
class Pending:
    """One tensor statistic not yet on the host: ``vector`` is (statistic, count) on its device."""

    name: str
    form: Form
    vector: Any
    replicated: Sequence[str] | str | None
    minibatch_reduce: str | None
    minibatch: int


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def reduce_tensor(values: Any, mask: Any, reduce: str) -> Any:
    """(statistic, count) of ``values`` over the entries where ``mask`` is true, on their device.

    ``count`` is the number of tokens (sequences for ``seq_mean``) that took part; a statistic
    over zero entries is dropped on the host rather than reported as 0 or infinity.
    """
    if reduce not in REDUCE_FORMS:
        raise ValueError(f"reduce must be one of {sorted(REDUCE_FORMS)}, got {reduce!r}")
    torch_input = _is_torch(values)
    v: Any
    m: Any
    zero: Any
    if torch_input:
        import torch

        xp: Any = torch
        v = values.detach()
        if mask is None:
            m = torch.ones_like(v, dtype=torch.bool)
        else:
            m = mask if mask.dtype == torch.bool else mask.bool()
            if m.device != v.device:
                m = m.to(v.device)
        zero = torch.zeros((), dtype=v.dtype, device=v.device)
        f64: Any = torch.float64
    else:
        xp = np
        v = np.asarray(values, dtype=np.float64)
        m = np.ones(v.shape, dtype=bool) if mask is None else np.asarray(mask).astype(bool)
        zero = np.float64(0.0)
        f64 = np.float64
    if tuple(m.shape) != tuple(v.shape):
        raise ValueError(f"mask shape {tuple(m.shape)} differs from values {tuple(v.shape)}")
    masked = xp.where(m, v, zero)
    count = m.sum(dtype=f64)
    if reduce in ("token_mean", "sum"):
        stat = masked.sum(dtype=f64)  # accumulate in float64 without copying the tensor
    elif reduce == "sqsum":
        stat = (masked * masked).sum(dtype=f64)
    elif reduce in ("min", "max"):
        empty = v.numel() == 0 if torch_input else v.size == 0
        if empty:
            stat = zero
        elif reduce == "min":
            stat = xp.where(m, v, xp.full_like(v, float("inf"))).min()
        else:
            stat = xp.where(m, v, xp.full_like(v, float("-inf"))).max()
    else:  # seq_mean: the mean of each sequence (last axis), pooled over sequences
        tokens = m.sum(-1, dtype=f64)
        has = tokens > 0
        per_seq = masked.sum(-1, dtype=f64) / xp.where(has, tokens, xp.ones_like(tokens))
        stat = xp.where(has, per_seq, zero).sum(dtype=f64)
        count = has.sum(dtype=f64)
    if torch_input:
        return torch.stack([stat.to(f64).reshape(()), count.reshape(())])
    return np.array([stat, count], dtype=np.float64)


def fetch(pending: Sequence[Pending]) -> tuple[list[tuple[float, float]], int]:
    """Host values of every pending vector, and how many device-to-host copies it took."""
    out: list[tuple[float, float] | None] = [None] * len(pending)
    by_device: dict[Any, list[int]] = {}
    for i, p in enumerate(pending):
        if _is_torch(p.vector):
            by_device.setdefault(p.vector.device, []).append(i)
        else:
            out[i] = (float(p.vector[0]), float(p.vector[1]))
    transfers = 0
    if by_device:
        import torch

        for idx in by_device.values():
            host = torch.stack([pending[i].vector for i in idx]).cpu().tolist()
            transfers += 1
            for i, (stat, count) in zip(idx, host, strict=True):
                out[i] = (stat, count)
    return [o for o in out if o is not None], transfers
