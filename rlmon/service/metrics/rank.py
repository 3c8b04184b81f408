"""Rank coordinates and world sizes over the four parallel axes (DP, CP, TP, PP)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import NamedTuple

__all__ = ["AXES", "Rank", "World", "replica_group"]

AXES: tuple[str, ...] = ("dp", "cp", "tp", "pp")


class Rank(NamedTuple):
    """Where a process sits in the parallel layout; a missing axis is 0."""

    dp: int = 0
    cp: int = 0
    tp: int = 0
    pp: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"dp": self.dp, "cp": self.cp, "tp": self.tp, "pp": self.pp}


class World(NamedTuple):
    """Sizes of the parallel axes; a missing axis is 1. Every rank of the world reports each step."""

    dp: int = 1
    cp: int = 1
    tp: int = 1
    pp: int = 1

    @property
    def size(self) -> int:
        return self.dp * self.cp * self.tp * self.pp

    def contains(self, rank: Rank) -> bool:
        return all(0 <= r < n for r, n in zip(rank, self, strict=True))

    def ranks(self) -> Iterator[Rank]:
        """Every rank of the world, in (dp, cp, tp, pp) order."""
        for coords in itertools.product(*(range(n) for n in self)):
            yield Rank(*coords)

    def as_dict(self) -> dict[str, int]:
        return {"dp": self.dp, "cp": self.cp, "tp": self.tp, "pp": self.pp}


def replica_group(rank: Rank, replicated: Iterable[str]) -> Rank:
    """The rank with its replicated axes zeroed: ranks that map to the same group hold one copy."""
    axes = frozenset(replicated)
    return Rank(*(0 if axis in axes else coord for axis, coord in zip(AXES, rank, strict=True)))
