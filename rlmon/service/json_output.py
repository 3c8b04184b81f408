"""JSON that a command prints: a value never makes the output fail.

JSON has no NaN or Infinity, and ``json.dumps(..., allow_nan=False)`` raises on them, an exit
status a CI gate would read like "a finding fired". Here a non-finite float becomes ``null``, and
where it is an object's value the reason is written beside it, ``"<key>_not_finite": "inf"``
(``"-inf"``, ``"nan"``); an element of a list has no place for a reason and is ``null`` alone.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["dumps", "finite"]


def _reason(value: float) -> str:
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def finite(value: Any) -> Any:
    """``value`` with every non-finite float replaced as the module says (iteratively: no
    recursion limit on a deep value)."""
    root: list[Any] = [value]
    stack: list[tuple[Any, Any]] = [(root, 0)]
    while stack:
        parent, key = stack.pop()
        item = parent[key]
        if isinstance(item, float) and not math.isfinite(item):
            parent[key] = None
            if isinstance(parent, dict):
                parent[f"{key}_not_finite"] = _reason(item)
        elif isinstance(item, dict):
            copy = dict(item)
            parent[key] = copy
            stack.extend((copy, k) for k in item)
        elif isinstance(item, (list, tuple)):
            listed = list(item)
            parent[key] = listed
            stack.extend((listed, i) for i in range(len(listed)))
    return root[0]


def dumps(value: Any) -> str:
    """One line of strict JSON, non-finite numbers written as ``null`` with their reason."""
    return json.dumps(finite(value), allow_nan=False)
