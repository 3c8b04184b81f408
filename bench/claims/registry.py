"""The claim kinds the benchmark scores, by name: each a function from seeds to a :class:`Score`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bench.claims.score import Score

__all__ = ["KINDS", "ClaimKind", "register"]

Scorer = Callable[[Sequence[int], bool], Score]


@dataclass(frozen=True, slots=True)
class ClaimKind:
    name: str  # "diff.parting"
    sentence: str  # the sentence rlmon prints that is scored
    score: Scorer  # (seeds, fast) -> Score


KINDS: dict[str, ClaimKind] = {}


def register(name: str, sentence: str) -> Callable[[Scorer], Scorer]:
    """Register a scorer under ``name`` (unique)."""
    def add(scorer: Scorer) -> Scorer:
        if name in KINDS:
            raise ValueError(f"claim kind {name!r} registered twice")
        KINDS[name] = ClaimKind(name, sentence, scorer)
        return scorer
    return add
