"""JSON read from a file someone handed to rlmon, with its nesting depth bounded.

Python's decoder and every recursive walk after it (flattening a config, a record's fields)
fail with a ``RecursionError`` traceback on a value nested a few thousand levels deep, and
deep enough values pass the decoder only to fail the walk. Every reader of foreign JSON decodes
through :func:`loads`: a value nested deeper than ``MAX_DEPTH`` is a :class:`TooDeep` error
(a ``ValueError``, which each reader already turns into a problem naming its file and line).
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["MAX_DEPTH", "TooDeep", "check_depth", "loads"]

MAX_DEPTH = 64  # configs and metric rows nest a few levels; DeepSpeed's config five or six


class TooDeep(ValueError):
    """A JSON value nested deeper than the readers go."""

    def __init__(self, limit: int = MAX_DEPTH) -> None:
        super().__init__(f"JSON nested deeper than {limit} levels: refused")


def check_depth(value: Any, limit: int = MAX_DEPTH) -> Any:
    """``value`` itself, once its containers are known to nest at most ``limit`` deep (walked
    with a stack of its own, never by recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)] if isinstance(value, (dict, list)) else []
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item
        for child in children:
            if isinstance(child, (dict, list)):
                if depth + 1 > limit:
                    raise TooDeep(limit)
                stack.append((child, depth + 1))
    return value


def loads(text: str | bytes | bytearray, limit: int = MAX_DEPTH) -> Any:
    """``json.loads`` with the depth bounded (and the bare ``NaN``/``Infinity`` tokens read,
    as Python's writers emit them). Raises :class:`TooDeep` or ``json.JSONDecodeError``."""
    opening = (text.count(b"[") + text.count(b"{") if isinstance(text, (bytes, bytearray))
               else text.count("[") + text.count("{"))
    try:
        value = json.loads(text)
    except RecursionError:
        raise TooDeep(limit) from None
    if opening > limit and isinstance(value, (dict, list)):  # else it cannot nest deeper
        check_depth(value, limit)
    return value
