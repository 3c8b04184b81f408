"""Counts in rlmon's sentences: "1 rank", "6 ranks", never "rank(s)"."""

from __future__ import annotations

from pathlib import Path

from rlmon.service.wording import counted
from tests.support.paths import REPO


def test_a_count_of_one_takes_the_singular_and_any_other_the_plural() -> None:
    assert [counted(n, "rank") for n in (0, 1, 2, 6)] == ["0 ranks", "1 rank", "2 ranks",
                                                          "6 ranks"]
    assert counted(1, "alert marker") == "1 alert marker"
    assert counted(3, "aggregator shard") == "3 aggregator shards"


def test_no_sentence_rlmon_prints_hedges_its_plural() -> None:
    """A "(s)" after a noun in a string rlmon prints reads as a form, not a sentence."""
    hedged = [f"{path.relative_to(REPO)}:{n}" for path in sorted((REPO / "rlmon").rglob("*.py"))
              for n, line in enumerate(Path(path).read_text().splitlines(), 1)
              if any(f"{noun}(s)" in line for noun in ("rank", "step", "alert", "diff", "shard",
                                                       "payload", "attempt", "marker", "event",
                                                       "role"))]
    assert hedged == []
