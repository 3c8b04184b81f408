"""A map that keeps what is in use and forgets what is not, in bounded memory.

Two generations: lookups and inserts go to the young one, a hit in the old one is moved back to
the young one, and :meth:`RecentMap.rotate` (or the young generation filling up) drops the old
generation and makes the young one old. An entry untouched for two rotations is gone; at most
``2 * limit`` entries are ever held. Used for what producers create without bound (metric names,
block schemas, node mergers) where forgetting costs only a re-check when the key comes back.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["RecentMap"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class RecentMap(Generic[K, V]):
    __slots__ = ("_old", "_young", "forgotten", "limit", "on_rotate")

    def __init__(self, limit: int, on_rotate: Callable[[], None] | None = None) -> None:
        self.limit = limit
        self.on_rotate = on_rotate
        self._young: dict[K, V] = {}
        self._old: dict[K, V] = {}
        self.forgotten = 0  # entries dropped by rotations

    def get(self, key: K) -> V | None:
        value = self._young.get(key)
        if value is None and key in self._old:
            value = self._old.pop(key)
            self._put(key, value)
        return value

    def __contains__(self, key: object) -> bool:
        return key in self._young or key in self._old

    def __len__(self) -> int:
        return len(self._young) + len(self._old)

    def setdefault(self, key: K, value: V) -> V:
        known = self.get(key)
        if known is not None:
            return known
        self._put(key, value)
        return value

    def __setitem__(self, key: K, value: V) -> None:
        self._old.pop(key, None)
        self._put(key, value)

    def _put(self, key: K, value: V) -> None:
        if len(self._young) >= self.limit:
            self.rotate()
        self._young[key] = value

    def rotate(self) -> None:
        """Forget the old generation; the young one becomes old."""
        self.forgotten += len(self._old)
        self._old, self._young = self._young, {}
        if self.on_rotate is not None:
            self.on_rotate()
