"""A job that calls ``ray.init`` itself, in its own namespace, with Reporters in its Ray actors.

    python examples/own_ray.py [--steps 12] [--run own-ray]

rlmon keeps its actors in its own namespace (``rlmon``) whatever the job's is. Two policy ranks
(DP=2) run as Ray actors, each with its own Reporter: rlmon's service and aggregators, started
from inside the first rank, are detached, so they outlive any one rank. Rank 1 reports a clip
ratio of 0.8 from step 2, so the step's token-weighted clip ratio passes 0.3 and
``ClipRatioHigh`` fires at step 4 (three bad steps).
"""

from __future__ import annotations

import argparse

import numpy as np
import ray
from exported import print_exported

from rlmon.actors.reporter import Reporter
from rlmon.actors.runtime import shutdown_runtime


@ray.remote(num_cpus=0)
class PolicyRank:
    def __init__(self, run: str, dp: int, world: int) -> None:
        self.reporter = Reporter(run, "actor", rank={"dp": dp}, world={"dp": world})
        self.dp = dp
        self.rng = np.random.default_rng(dp)

    def train_step(self, step: int) -> None:
        tokens = int(self.rng.integers(200, 300))
        clipped = 0.8 if self.dp == 1 and step >= 2 else 0.05
        self.reporter.record("actor/clip_ratio", sum=clipped * tokens, count=tokens)
        self.reporter.record("actor/loss", sum=float(self.rng.normal()) * tokens, count=tokens)
        self.reporter.end_step(step)

    def close(self) -> bool:
        flushed = self.reporter.flush(timeout=60)
        self.reporter.close()  # the closing heartbeat: rlmon hears the run finished, not silent
        return flushed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--run", default="own-ray")
    args = p.parse_args()

    ray.init(namespace="my-project", include_dashboard=False)
    ranks = [PolicyRank.remote(args.run, dp, 2) for dp in range(2)]
    for step in range(args.steps):
        ray.get([rank.train_step.remote(step) for rank in ranks])
    print("flushed:", ray.get([rank.close.remote() for rank in ranks]))
    print_exported(args.run, "actor", args.steps - 1)
    # rlmon's runtime was started inside a rank, detached: stop it gracefully (finalize, deliver
    # the alerts) before the job's own ray.shutdown(), after which rlmon never starts Ray again.
    shutdown_runtime()
    ray.shutdown()


if __name__ == "__main__":
    main()
