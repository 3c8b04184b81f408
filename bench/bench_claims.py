"""The claims benchmark (issue 39): every kind of sentence rlmon prints, scored against runs
generated with known truth, written by the formats' own writers and read back, on the seeds the
methods were tuned on and on held-out seeds, apart.

Per claim kind (``bench/claims/kinds/``): precision (claims made that were right), recall (cases
with something to say where it was said right), false claims (and the silent cases they were
made on), delay (steps from the truth's onset to the step claimed), coverage (a stated 90 %
range holding the truth) and the range's median width over the truth's distance.

``--fast`` scores a few seeds of each kind on short runs (the project tests use it);
``--kinds`` picks kinds by name prefix; ``--markdown`` prints the table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.claims import KINDS, Score
from bench.claims import kinds as _kinds  # noqa: F401  (registers the kinds)

TUNING = range(100, 140)  # the seeds the methods were tuned on
HELD_OUT = range(9100, 9140)  # never looked at while tuning
FAST = 4

COLUMNS = ("kind", "precision", "recall", "false claims", "delay (steps)", "coverage",
           "width / distance", "notes")


def run(names: list[str], seeds: range, fast: bool) -> list[Score]:
    scores = []
    for name in names:
        started = time.perf_counter()
        score = KINDS[name].score(list(seeds), fast)
        print(f"  {name}: {time.perf_counter() - started:.1f} s", file=sys.stderr)
        scores.append(score)
    return scores


def table(scores: list[Score]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(s.row()[c] for c in COLUMNS) + " |" for s in scores]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="a few seeds, short runs")
    parser.add_argument("--kinds", default="", help="comma-separated name prefixes")
    parser.add_argument("--seeds", type=int, default=0, help="seeds per set (default 40)")
    parser.add_argument("--misses", action="store_true", help="print a few wrong claims")
    args = parser.parse_args(argv)
    prefixes = [p for p in args.kinds.split(",") if p]
    names = [n for n in KINDS if not prefixes or any(n.startswith(p) for p in prefixes)]
    count = FAST if args.fast else (args.seeds or len(TUNING))
    for label, seeds in (("tuning seeds", range(TUNING.start, TUNING.start + count)),
                         ("held-out seeds", range(HELD_OUT.start, HELD_OUT.start + count))):
        print(f"\n{label} {seeds.start}-{seeds.stop - 1}:")
        scores = run(names, seeds, args.fast)
        print(table(scores))
        if args.misses:
            for score in scores:
                for miss in score.misses:
                    print(f"  miss {score.kind}: {miss}")
    for name in names:
        print(f"- `{name}`: {KINDS[name].sentence}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
