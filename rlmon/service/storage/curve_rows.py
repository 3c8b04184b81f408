"""The key curves of each stored step, packed in one small row beside its step line.

A 100,000-step run's step lines are about 200 MB of JSON; pulling ten curves out of them takes
seconds, which is what opening a long run on the page cost right after a service start. The
history store therefore also writes, in the same transaction as each step, the values of the
catalog's key-curve metrics (:data:`CURVE_METRICS`) as one blob of little-endian float64s, about
a hundred bytes a step: the page reads a whole run's curves from about 10 MB (docs/page.md,
"Load times").

A value the step did not report is stored as a NaN with a payload of its own (:data:`ABSENT`), so
a reported NaN (canonical NaN) and a reported infinity stay what they were and the page can mark
them. The layout (the metrics, in order) is kept in the file: a store written with another layout
is packed again from its step lines on open.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping, Sequence

import numpy as np

from rlmon.service.metrics import catalog
from rlmon.service.metrics.nonfinite import NONFINITE_VALUES

__all__ = ["ABSENT_BITS", "CURVE_METRICS", "pack", "pack_stored", "unpack"]

CURVE_METRICS: tuple[str, ...] = (
    catalog.IS_RATIO, catalog.IS_RATIO_MIN, catalog.IS_RATIO_MAX, catalog.LOGP_DIFF,
    catalog.LOGP_DIFF_MAX, catalog.KL, catalog.ENTROPY, catalog.CLIP_RATIO, catalog.REWARD,
    catalog.GRAD_NORM, catalog.RESPONSE_LENGTH, catalog.POLICY_LAG, catalog.STEP_SECONDS,
)
ABSENT_BITS = 0x7FF4_AB5E_0000_0001  # a NaN no computation produces: "not reported"
_ABSENT: float = struct.unpack("<d", ABSENT_BITS.to_bytes(8, "little"))[0]
_FORMAT = struct.Struct(f"<{len(CURVE_METRICS)}d")
# the step line's names of non-finite values (StepRecord.to_json)


def pack(metrics: Mapping[str, float]) -> bytes:
    """One step's key-curve values (``metrics``: every metric of the step, any NaN canonical)."""
    out = []
    for name in CURVE_METRICS:
        value = metrics.get(name)
        out.append(_ABSENT if value is None else (value if value == value else math.nan))
    return _FORMAT.pack(*out)


def pack_stored(*columns: float | str | None) -> bytes:
    """The same from a stored step line: for each of :data:`CURVE_METRICS`, its JSON value, then
    for each its ``nonfinite`` name (what the back-fill's SQL extracts)."""
    k = len(CURVE_METRICS)
    out = []
    for value, text in zip(columns[:k], columns[k:], strict=True):
        if text is not None:
            out.append(NONFINITE_VALUES[str(text)])
        elif value is None:
            out.append(_ABSENT)
        else:
            out.append(float(value))
    return _FORMAT.pack(*out)


def unpack(blobs: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """(values, absent) of ``len(blobs)`` steps × :data:`CURVE_METRICS`: values as stored (NaN
    where absent too), and where the step did not report the metric."""
    k = len(CURVE_METRICS)
    raw = np.frombuffer(b"".join(blobs), dtype="<u8").reshape(len(blobs), k)
    return raw.view("<f8").astype(np.float64), raw == ABSENT_BITS
