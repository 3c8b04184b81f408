"""Worst samples on the device path: per-sequence scores and top-k on the device, payloads for
the selected few only.

``Reporter.record_sample_tensor`` turns per-token values (with a mask) or per-sequence values
into one score per sequence on their device (the mean, max, min or sum over its tokens), orders
the scores there with one stable sort, and keeps the best ``k``: their scores, their indices and
whether they had a token, as one small float64 piece that joins the step's single device-to-host
copy (:meth:`~rlmon.actors.reporter.tensor_stats.HeldTensors.attach`). Only after that copy, on the sender
thread, does the caller's ``ids`` and ``payload`` get asked about the selected indices, so text
is decoded for ``k`` sequences, never for the batch. numpy arrays take the same path on the host.

The order is the ranked forms' (:mod:`rlmon.service.metrics.ranked_forms`): a NaN score first, then by score,
ties by sequence index (the sort is stable), sequences without a token never. Payloads are
opt-in (none unless the caller gives ``payload``), pass the Reporter's ``redact`` hook, and are
cut to :data:`~rlmon.service.metrics.ranked_forms.MAX_PAYLOAD_BYTES` at a UTF-8 boundary (counted).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from rlmon.service.metrics.ranked_forms import MAX_ID, MAX_K, MAX_PAYLOAD_BYTES, Sample

__all__ = [
    "DevicePick",
    "Labels",
    "Score",
    "check_k",
    "cut_payload",
    "pick_array",
    "pick_tensor",
    "sample_id",
]

Score = Literal["mean", "max", "min", "sum"]
# Ids or payloads of the sequences by index: a sequence (list of text, a tensor or array of
# numbers) or a function of the index. Asked only for the selected few.
Labels = Sequence[Any] | Callable[[int], Any] | Any | None
_SCORES = ("mean", "max", "min", "sum")


def check_k(name: str, k: Any) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise ValueError(f"{name}: k must be an integer in 1..{MAX_K}, got {k!r}")
    return k


def _check_score(name: str, score: str) -> None:
    if score not in _SCORES:
        raise ValueError(f"{name}: score must be one of {_SCORES}, got {score!r}")


def cut_payload(text: str) -> tuple[str, bool]:
    """``text`` as stored: valid UTF-8 (lone surrogates replaced), at most MAX_PAYLOAD_BYTES
    bytes, cut at a character boundary; and whether it was cut."""
    data = text.encode("utf-8", "replace")
    if len(data) <= MAX_PAYLOAD_BYTES:
        return (text if len(data) == len(text.encode("utf-8", "surrogatepass"))
                else data.decode("utf-8")), False
    return data[:MAX_PAYLOAD_BYTES].decode("utf-8", "ignore"), True


def sample_id(value: Any) -> str:
    """An id as the contract takes it: 1-128 printable characters."""
    text = "".join(c if c.isprintable() else "?" for c in str(value)[:MAX_ID])
    return text or "?"


def _label(labels: Labels, index: int) -> Any:
    if callable(labels):
        return labels(index)
    item = labels[index]  # type: ignore[index]
    return item.item() if hasattr(item, "item") and getattr(item, "ndim", 1) == 0 else item


def build_items(
    picked: Iterable[tuple[float, int]], ids: Labels, payload: Labels, prefix: str,
    offset: int, redact: Callable[[str], str] | None,
) -> tuple[list[Sample], int]:
    """The items of the selected (score, index) pairs, best first; and how many payloads were
    cut. Without ``ids`` a sequence's id is ``prefix`` and ``offset`` + its index."""
    items: list[Sample] = []
    cut = 0
    for score, index in picked:
        ident = sample_id(_label(ids, index)) if ids is not None else f"{prefix}{offset + index}"
        text = ""
        if payload is not None:
            raw = _label(payload, index)
            text = raw if isinstance(raw, str) else str(raw)
            if redact is not None:
                text = redact(text)
            text, was_cut = cut_payload(text)
            cut += was_cut
        items.append((score, ident, text))
    return items, cut


# -- the host path (numpy): select at once -----------------------------------------------------


def pick_array(values: Any, mask: Any, score: str, k: int, largest: bool,
               name: str = "samples") -> list[tuple[float, int]]:
    """The best ``k`` (score, index) of an array's sequences; also the reference the device
    path is tested against."""
    _check_score(name, score)
    v = np.asarray(values, dtype=np.float64)
    if v.ndim == 0:
        raise ValueError(f"{name}: give one value per sequence or per token (last axis)")
    m = None if mask is None else np.asarray(mask).astype(bool)
    if m is not None and m.shape != v.shape:
        raise ValueError(f"{name}: mask shape {m.shape} differs from values {v.shape}")
    if v.ndim == 1:
        scores = v
        valid = np.ones(v.shape, dtype=bool) if m is None else m
    else:
        v = v.reshape(-1, v.shape[-1])
        m = np.ones(v.shape, dtype=bool) if m is None else m.reshape(v.shape)
        tokens = m.sum(-1)
        valid = tokens > 0
        with np.errstate(invalid="ignore"):
            if score == "mean":
                scores = np.where(m, v, 0.0).sum(-1) / np.maximum(tokens, 1)
            elif score == "sum":
                scores = np.where(m, v, 0.0).sum(-1)
            elif score == "max":
                scores = np.where(m, v, -np.inf).max(-1) if v.shape[-1] else tokens * 0.0
            else:
                scores = np.where(m, v, np.inf).min(-1) if v.shape[-1] else tokens * 0.0
    key = scores if largest else -scores
    nan = np.isnan(key)
    order = np.lexsort((np.arange(len(key)), -np.where(nan, 0.0, key), ~nan, ~valid))
    return [(float(scores[i]), int(i)) for i in order[:k] if valid[i]]


# -- the device path (torch): score and select on the device, fetch with the step's copy -------


@dataclass(frozen=True, slots=True)
class DevicePick:
    """One ``record_sample_tensor`` call in flight: where its ``n`` (score, index, had a
    token) triples lie in its device's vector after the step's copy."""

    name: str
    form: Any
    k: int
    device: Any
    start: int
    n: int
    ids: Labels
    payload: Labels
    prefix: str  # of a default id: prefix + offset + index
    offset: int

    def picked(self, row: Sequence[float]) -> list[tuple[float, int]]:
        s, n = self.start, self.n
        scores, index, valid = row[s:s + n], row[s + n:s + 2 * n], row[s + 2 * n:s + 3 * n]
        return [(scores[j], int(index[j])) for j in range(n) if valid[j]]


def pick_tensor(values: Any, mask: Any, score: str, k: int, largest: bool,
                name: str = "samples") -> tuple[Any, int]:
    """On the values' device: the best ``k`` sequences as one float64 piece (scores, indices,
    had-a-token flags, each of length n), and n. Launches a few kernels; copies nothing."""
    import torch

    _check_score(name, score)
    x = values.detach() if values.requires_grad else values
    if x.ndim == 0:
        raise ValueError(f"{name}: give one value per sequence or per token (last axis)")
    if mask is not None and tuple(mask.shape) != tuple(x.shape):
        raise ValueError(f"{name}: mask shape {tuple(mask.shape)} differs from values "
                         f"{tuple(x.shape)}")
    f64 = torch.float64
    m = None
    if mask is not None:
        m = mask if mask.dtype == torch.bool else mask.bool()
        if m.device != x.device:
            m = m.to(x.device)
    valid = None
    if x.ndim == 1:
        scores = x.to(f64)
        valid = m
    else:
        x = x.reshape(-1, x.shape[-1])
        if m is not None:
            m = m.reshape(x.shape)
        if not (x.dtype.is_floating_point or x.dtype.is_complex):
            x = x.to(f64)  # integers and bools: exact in float64, and -inf/inf fills exist
        if score in ("mean", "sum"):
            scores = (x if m is None else torch.where(m, x, 0.0)).sum(-1, dtype=f64)
            if score == "mean":
                tokens = (m.sum(-1, dtype=f64).clamp(min=1.0) if m is not None
                          else float(max(x.shape[-1], 1)))
                scores = scores / tokens
        elif x.shape[-1]:
            fill = -math.inf if score == "max" else math.inf
            src = x if m is None else torch.where(m, x, fill)
            scores = (src.amax(-1) if score == "max" else src.amin(-1)).to(f64)
        else:
            scores = torch.zeros(x.shape[0], dtype=f64, device=x.device)
        if m is not None:
            valid = m.any(-1)
        elif not x.shape[-1]:
            valid = torch.zeros(x.shape[0], dtype=torch.bool, device=x.device)
    # descending and stable: NaN first, then the best, ties by index (the ranked order)
    order = torch.sort(scores if largest else -scores, descending=True, stable=True).indices
    if valid is not None:  # sequences without a token go last, the order kept otherwise
        order = order[torch.sort(valid[order].to(torch.int8), descending=True,
                                 stable=True).indices]
    order = order[:k]
    n = int(order.shape[0])
    flags = (valid[order].to(f64) if valid is not None
             else torch.ones(n, dtype=f64, device=x.device))
    return torch.cat((scores[order], order.to(f64), flags)), n
