"""Ranked statistic forms: the k items of highest (or lowest) score, with an id and a payload.

A state is ``(k, item, item, ...)``, each item a :data:`Sample` ``(score, id, payload)``, best
first. Merging keeps the best ``min(k)`` items of the union, one per id (the best-ranked copy:
replicas of a rank send the same ids), ordered by score, then id, then payload, so any split over ranks and
micro-batches, in any order, gives the global top-k of the step. A NaN score ranks first: a NaN
log-prob difference is the worst sample there is.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rlmon.service.metrics.nonfinite import nonfinite_name

__all__ = ["MAX_ID", "MAX_K", "MAX_PAYLOAD_BYTES", "Ranked", "RankedError", "Sample", "json_score"]

Sample = tuple[float, str, str]  # (score, id, payload); payload "" when none
MAX_K = 64  # items per ranked partial: forensics wants the worst few, not a dataset
MAX_ID = 128  # characters of an item id
MAX_PAYLOAD_BYTES = 2048  # UTF-8 bytes of one payload (the Reporter cuts longer ones, counted)


class RankedError(ValueError):
    """A ranked state breaks the contract; ``slot`` names the culprit below the metric."""

    def __init__(self, slot: str, message: str) -> None:
        super().__init__(message)
        self.slot = slot


@dataclass(frozen=True, slots=True)
class Ranked:
    """Top (``highest``) or bottom items, under JSON key ``key`` beside ``k``."""

    key: str
    highest: bool

    def order(self, item: Sample) -> tuple[int, float, str, str]:
        """The rank of an item: NaN first, then by score, ties by id, then payload (a total
        order, so which copy of an id is kept never depends on arrival order)."""
        score = item[0]
        if score != score:
            return (0, 0.0, item[1], item[2])
        return (1, -score if self.highest else score, item[1], item[2])

    def combine(self, x: tuple[Any, ...], y: tuple[Any, ...]) -> tuple[Any, ...]:
        k = min(x[0], y[0])
        best: dict[str, Sample] = {}
        for item in (*x[1:], *y[1:]):
            known = best.get(item[1])
            if known is None or self.order(item) < self.order(known):
                best[item[1]] = item
        return (k, *sorted(best.values(), key=self.order)[: int(k)])

    def finalize(self, x: tuple[Any, ...]) -> float | None:
        return x[1][0] if len(x) > 1 else None

    def to_json(self, x: tuple[Any, ...]) -> dict[str, Any]:
        return {"k": int(x[0]), self.key: [
            [json_score(s), i] + ([p] if p else []) for s, i, p in x[1:]]}

    def parse(self, value: Mapping[str, Any], field: str,
              number: Callable[[Any, str], float]) -> tuple[Any, ...]:
        """A state from a partial's JSON object (``number`` reads a contract number)."""
        items = value.get(self.key)
        if not isinstance(items, list):
            raise RankedError(self.key, f"must be a list of [score, id] or [score, id, payload], "
                              f"got {type(items).__name__}")
        samples: list[Sample] = []
        for i, item in enumerate(items):
            if not isinstance(item, list) or len(item) not in (2, 3):
                raise RankedError(f"{self.key}.{i}", "must be [score, id] or [score, id, payload]")
            payload = item[2] if len(item) == 3 else ""
            samples.append((number(item[0], f"{field}.{self.key}.{i}.score"), item[1], payload))
        return self.check((value.get("k"), *samples))

    def check(self, state: Any) -> tuple[Any, ...]:
        """The state normalized (k an int, items best first), or RankedError naming the slot."""
        if not isinstance(state, tuple | list) or not state:
            raise RankedError("", f"a {self.key!r} state must be (k, items...), got "
                              f"{type(state).__name__}")
        k = state[0]
        if isinstance(k, float) and k.is_integer():
            k = int(k)
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
            raise RankedError("k", f"must be an integer in 1..{MAX_K}, got {k!r}")
        items = state[1:]
        if len(items) > k:
            raise RankedError(self.key, f"{len(items)} items exceed k = {k}")
        seen: set[str] = set()
        out: list[Sample] = []
        for i, item in enumerate(items):
            if not isinstance(item, tuple | list) or len(item) != 3:
                raise RankedError(f"{self.key}.{i}", "must be (score, id, payload)")
            score, ident, payload = item
            if isinstance(score, bool) or not isinstance(score, int | float):
                raise RankedError(f"{self.key}.{i}.score", f"must be a number, got {score!r}")
            if not isinstance(ident, str) or not 1 <= len(ident) <= MAX_ID \
                    or not ident.isprintable():
                raise RankedError(f"{self.key}.{i}.id", f"must be 1-{MAX_ID} printable "
                                  f"characters, got {ident!r:.40}")
            if ident in seen:
                raise RankedError(f"{self.key}.{i}.id", f"{ident!r} appears twice")
            seen.add(ident)
            if not isinstance(payload, str):
                raise RankedError(f"{self.key}.{i}.payload", "must be text")
            size = len(payload.encode("utf-8", "surrogatepass"))
            if size > MAX_PAYLOAD_BYTES:
                raise RankedError(f"{self.key}.{i}.payload", f"{size} bytes exceed "
                                  f"{MAX_PAYLOAD_BYTES} (cut it before sending)")
            out.append((float(score), ident, payload))
        return (k, *sorted(out, key=self.order))


def json_score(score: float) -> float | str:
    """A score as JSON: a number, or "NaN"/"Infinity"/"-Infinity" as the contract writes them."""
    if math.isfinite(score):
        return score
    return nonfinite_name(score)
