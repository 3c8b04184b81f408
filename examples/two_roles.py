"""A plain training loop with two roles in one driver: two Reporters share one rlmon runtime.

    python examples/two_roles.py [--steps 10] [--run two-roles]

The actor (policy) and the critic each get a Reporter; any number of Reporters in a process, made
and closed in any order, reach the same service and aggregators. Both roles' losses and gradient
norms stay healthy (``GradNormHigh`` stays quiet; the critic's series are its own, under role
``critic``), while the actor's entropy collapses: ``EntropyCollapse`` fires at step 5 on this
console.
"""

from __future__ import annotations

import argparse

import numpy as np
from exported import print_exported

from rlmon.actors.reporter import Reporter


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--run", default="two-roles")
    args = p.parse_args()
    rng = np.random.default_rng(1)

    actor = Reporter(args.run, "actor", rank={"dp": 0}, world={"dp": 1})
    critic = Reporter(args.run, "critic", rank={"dp": 0}, world={"dp": 1})
    for step in range(args.steps):
        tokens = 256
        entropy = 1.1 if step < 3 else 0.001  # the policy collapsed
        actor.record("actor/entropy", sum=entropy * tokens, count=tokens)
        actor.record("actor/loss", sum=float(rng.normal()) * tokens, count=tokens)
        actor.record("actor/grad_norm", value=float(rng.uniform(0.5, 1.5)))
        actor.end_step(step)
        critic.record("critic/loss", sum=float(rng.uniform(0.1, 0.3)) * tokens, count=tokens)
        critic.record("critic/grad_norm", value=float(rng.uniform(0.5, 1.5)))
        critic.end_step(step)
    critic.close()  # closing one Reporter leaves the other and the runtime running
    actor.record("actor/entropy", sum=0.0, count=1)
    actor.end_step(args.steps)
    actor.flush(timeout=60)
    print_exported(args.run, "actor", args.steps)


if __name__ == "__main__":
    main()
