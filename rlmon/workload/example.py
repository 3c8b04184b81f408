"""Write the bundled example run: ``python -m rlmon.workload.example > rlmon/data/example_run.jsonl``.

The records come from :func:`rlmon.workload.grpo.simulate` (DP=2 x CP=2 policy ranks, a rollout
engine that stops receiving weights at step 3, a reward worker; 30 steps, seed 0: the default
``rlmon demo``), shuffled a little within each step so that replay sees ranks arriving out of
order, as they do in a live run. ``tests/e2e/test_demo_workload.py`` checks the bundled file is
current.
"""

from __future__ import annotations

import json
import random
import sys

from rlmon.workload.grpo import simulate


def main() -> None:
    rng = random.Random(7)
    step_records: list[dict[str, object]] = []
    current = None
    for record in simulate(run="grpo-demo-0"):
        if record["step"] != current and step_records:
            rng.shuffle(step_records)
            _emit(step_records)
            step_records = []
        current = record["step"]
        step_records.append(record)
    _emit(step_records)


def _emit(records: list[dict[str, object]]) -> None:
    # Within a rank, micro-batch records keep their order; only ranks interleave.
    records.sort(key=lambda r: (r.get("seq", 0)))  # type: ignore[arg-type, return-value]
    for record in records:
        sys.stdout.write(json.dumps(record, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
