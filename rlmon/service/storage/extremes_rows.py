"""Each stored step's per-rank extremes (the page's band across ranks), packed beside its step.

A step's extremes are two floats per metric that two ranks or more reported: as JSON they cost
as much to write as the step line itself (a float's text is the slow part of ``json.dumps``), so
they are stored as one blob of little-endian float64s, ``(low, high)`` per metric, NaN and
infinities as they are, and the metrics' names once per *layout* (the metric names of a step, in
order: a run's steps share a few), in a table of their own that rows refer to by number.
Reading a band is then a seek per step and numpy over the blobs of each layout.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

__all__ = ["Extremes", "layout_row", "pack", "unpack"]


def pack(extremes: Mapping[str, tuple[float, float]]) -> tuple[tuple[str, ...], bytes]:
    """The layout (the names, in order) and the blob of a step's extremes."""
    names = tuple(extremes)
    blob = np.array([pair for pair in extremes.values()], dtype="<f8").tobytes()
    return names, blob


# A metric's extremes at some steps: (steps, lows, highs), arrays in step order
Extremes = tuple[np.ndarray, np.ndarray, np.ndarray]


def unpack(layouts: Mapping[int, Sequence[str]], rows: Iterable[tuple[int, int, bytes]],
           wanted: Iterable[str]) -> dict[str, Extremes]:
    """Per metric of ``wanted``, its lows and highs at the steps of ``rows`` ((step, layout,
    blob)) that hold it, in step order; each layout's rows are read as one array."""
    want = set(wanted)
    parts: dict[str, list[Extremes]] = {m: [] for m in want}
    by_layout: dict[int, tuple[list[int], list[bytes]]] = {}
    for step, layout, blob in rows:
        steps, blobs = by_layout.setdefault(layout, ([], []))
        steps.append(step)
        blobs.append(blob)
    for layout, (steps, blobs) in by_layout.items():
        names = layouts.get(layout)
        if names is None:
            continue
        picked = [(i, n) for i, n in enumerate(names) if n in want]
        if not picked:
            continue
        values = np.frombuffer(b"".join(blobs), dtype="<f8").reshape(len(steps), len(names), 2)
        at = np.array(steps, dtype=np.int64)
        for i, name in picked:
            parts[name].append((at, values[:, i, 0], values[:, i, 1]))
    out: dict[str, Extremes] = {}
    for name, found in parts.items():
        if not found:
            out[name] = (np.zeros(0, dtype=np.int64), np.zeros(0), np.zeros(0))
            continue
        steps_, lows, highs = (np.concatenate(c) for c in zip(*found, strict=True))
        order = np.argsort(steps_, kind="stable")
        out[name] = (steps_[order], lows[order], highs[order])
    return out


def layout_row(names: tuple[str, ...]) -> tuple[int, str]:
    """A layout's number and its names as stored: the number is a digest of the names, so that
    every writer gives a layout the same one without asking the file (each batch of steps adds
    its layouts with ``INSERT OR IGNORE``, in the batch's transaction)."""
    text = json.dumps(names, separators=(",", ":"))
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True), text
