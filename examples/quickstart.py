"""The README's first snippet: one line of setup, nothing configured.

    python examples/quickstart.py [--steps 12] [--run quickstart]

The first ``end_step`` starts a local Ray and the rlmon service in the background (the training
loop never waits for it); alerts print on this console, ``/metrics`` serves on 127.0.0.1:9464
(or a free port, said once), and at exit the Reporter flushes and the last steps are finalized.
The stand-in "training" below has no learning signal from step 2 on (every prompt group's
rewards tie), so rlmon's critical ``NoLearningSignal`` fires at step 4.
"""

from __future__ import annotations

import argparse

import numpy as np
from exported import print_exported

from rlmon.actors.reporter import Reporter


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--run", default="quickstart")
    args = p.parse_args()
    rng = np.random.default_rng(0)

    rep = Reporter(args.run, "actor")  # the one line: rank and world come from the environment
    for step in range(args.steps):
        groups = rng.integers(0, 2, size=(8, 4)).astype(float)  # 8 prompts x 4 samples
        if step >= 2:
            groups[:] = 0.0  # the reward model broke: every group ties
        tied = float((groups.std(axis=1) == 0).sum())
        rep.record("rollout/reward", sum=float(groups.sum()), count=groups.size)
        rep.record("rollout/frac_reward_zero_std", sum=tied, count=len(groups))
        rep.record("actor/entropy", sum=float(rng.uniform(0.8, 1.2)) * 512, count=512)
        rep.end_step(step)
    rep.flush(timeout=60)  # optional: wait until rlmon has every step, to peek at /metrics
    print_exported(args.run, "actor", args.steps - 1)
    # No close() needed: at exit rlmon flushes, finalizes and delivers, then Ray stops.


if __name__ == "__main__":
    main()
