"""A count and its noun as a sentence says it: "1 rank", "6 ranks", never a hedged plural."""

from __future__ import annotations

__all__ = ["counted"]


def counted(n: int, noun: str) -> str:
    """``n`` and ``noun``, the noun with an ``s`` for any count but one."""
    return f"{n} {noun if n == 1 else noun + 's'}"
