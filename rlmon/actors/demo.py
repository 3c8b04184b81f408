"""The demo's RL job as Ray actors: policy ranks (DP x CP), a rollout worker, a reward worker.

The arithmetic is :mod:`rlmon.workload.grpo` (real GRPO in numpy); this module only places it in
separate processes the way a Ray RLHF framework does and gives every process its own Reporter.
The driver plays the trainer's collective: it sums the ranks' gradient shards of a mini-batch and
broadcasts the new weights (what an all-reduce would do), so the numbers are exactly those of
:func:`~rlmon.workload.grpo.simulate`, faults included (see :data:`FAULTS` and the alerts each
one fires in :mod:`rlmon.workload.grpo`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlmon.actors.reporter import Reporter
from rlmon.actors.runtime import RuntimeOptions
from rlmon.service.metrics import catalog
from rlmon.workload import grpo

__all__ = ["FAULTS", "DemoJob", "record_partials"]

FAULTS = grpo.FAULTS


def record_partials(
    rep: Reporter, partials: Mapping[str, Mapping[str, Any]], minibatch: int = 0
) -> None:
    """Record contract-style partial dicts (``{"sum": .., "count": ..}``) through a Reporter;
    ranked ones (``{"k": .., "bottom": [..]}``: worst samples) through ``record_many``."""
    for name, partial in partials.items():
        if "k" in partial:
            rep.record_many({name: partial})
        else:
            rep.record(name, minibatch=minibatch, **partial)


def _actor_classes() -> tuple[Any, Any, Any]:
    import ray

    remote: Any = ray.remote

    @remote(num_cpus=0, max_restarts=0)
    class PolicyRank:
        def __init__(self, namespace: str, run: str, dp: int, cp: int, world: dict[str, int],
                     cfg: grpo.GRPOConfig, theta_ref: np.ndarray, opts: RuntimeOptions,
                     steps: int) -> None:
            self.rep = Reporter(run, "actor", rank={"dp": dp, "cp": cp}, world=world,
                                namespace=namespace, runtime=opts, total_steps=steps)
            self.dp, self.cp, self.world, self.cfg = dp, cp, world, cfg
            self.theta_ref = theta_ref
            self.theta_old = theta_ref
            self.shards: list[grpo.Shard] = []

        def begin(self, batch: grpo.Batch, adv: np.ndarray, theta_old: np.ndarray) -> None:
            self.shards = grpo.make_shards(batch, adv, self.cfg, self.world["dp"],
                                           self.world["cp"], self.dp, self.cp)
            self.theta_old = theta_old

        def minibatch(self, m: int, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
            """Update ``m`` of the step (epoch ``m // minibatches``): this rank's gradient sum,
            as the rows it touches (a few of the table's) and their values, and its tokens."""
            with self.rep.span("train"):
                partials, grad, n_tok = grpo.shard_partials(
                    self.shards[m % self.cfg.minibatches], theta, self.theta_old,
                    self.theta_ref, self.cfg)
            record_partials(self.rep, partials, m)
            rows = np.flatnonzero(np.abs(grad).sum(axis=(1, 2)))
            return rows, grad[rows], n_tok

        def finish(self, step: int, norms: list[float], lr: float) -> None:
            for m, norm in enumerate(norms):
                self.rep.record(catalog.GRAD_NORM, value=norm, minibatch_reduce="mean",
                                minibatch=m)
            self.rep.record(catalog.LR, value=lr)
            self.rep.end_step(step)

        def flush(self) -> bool:
            return self.rep.flush(30)

        def close(self) -> None:  # the end of training: the rank says it ended cleanly
            self.rep.close(30)

    @remote(num_cpus=0, max_restarts=0)
    class RolloutWorker:
        def __init__(self, namespace: str, run: str, cfg: grpo.GRPOConfig, theta: np.ndarray,
                     opts: RuntimeOptions, steps: int) -> None:
            self.rep = Reporter(run, "rollout", namespace=namespace, runtime=opts,
                                total_steps=steps)
            self.engine = grpo.Rollout(cfg, theta, seed=cfg.seed + 2)
            self.cfg = cfg
            self.targets = grpo.targets_for(cfg)

        def generate(self, step: int, prompts: np.ndarray) -> grpo.Batch:
            start = time.perf_counter()
            with self.rep.span("generate"):
                batch = self.engine.generate(prompts, self.targets)
            seconds = time.perf_counter() - start
            record_partials(self.rep, grpo.rollout_partials(batch, self.cfg, step, seconds))
            self.rep.end_step(step)
            return batch

        def sync(self, theta: np.ndarray, version: int) -> None:
            with self.rep.span("weight_sync"):
                self.engine.sync(theta, version)

        def flush(self) -> bool:
            return self.rep.flush(30)

        def close(self) -> None:  # the end of training: the rank says it ended cleanly
            self.rep.close(30)

    @remote(num_cpus=0, max_restarts=0)
    class RewardWorker:
        def __init__(self, namespace: str, run: str, cfg: grpo.GRPOConfig,
                     opts: RuntimeOptions, steps: int) -> None:
            self.rep = Reporter(run, "reward", namespace=namespace, runtime=opts,
                                total_steps=steps)
            self.cfg = cfg

        def score(self, step: int, batch: grpo.Batch) -> np.ndarray:
            with self.rep.span("reward"):
                adv, zero_std = grpo.group_advantages(batch.rewards, self.cfg.group_size)
            record_partials(self.rep, grpo.reward_partials(batch.rewards, zero_std))
            self.rep.end_step(step)
            return adv

        def flush(self) -> bool:
            return self.rep.flush(30)

        def close(self) -> None:  # the end of training: the rank says it ended cleanly
            self.rep.close(30)

    return PolicyRank, RolloutWorker, RewardWorker


@dataclass
class DemoJob:
    """Drives one GRPO run on Ray; ``on_step`` is called after each trainer step."""

    namespace: str
    run: str
    steps: int
    dp: int
    cp: int
    fault: str
    fault_step: int
    opts: RuntimeOptions
    config: grpo.GRPOConfig = field(default_factory=grpo.GRPOConfig)

    def execute(self, on_step: Callable[[int], None] | None = None) -> dict[str, Any]:
        import ray

        if self.fault not in FAULTS:
            raise ValueError(f"fault must be one of {FAULTS}, got {self.fault!r}")
        PolicyRank, RolloutWorker, RewardWorker = _actor_classes()
        cfg = self.config
        trainer = grpo.Trainer(cfg)
        world = {"dp": self.dp, "cp": self.cp}
        theta_ref = ray.put(trainer.theta_ref)
        ranks = {
            (d, c): PolicyRank.remote(self.namespace, self.run, d, c, world, cfg, theta_ref,
                                      self.opts, self.steps)
            for d in range(self.dp) for c in range(self.cp)
        }
        rollout = RolloutWorker.remote(self.namespace, self.run, cfg, trainer.theta, self.opts,
                                       self.steps)
        reward = RewardWorker.remote(self.namespace, self.run, cfg, self.opts, self.steps)
        prompt_rng = np.random.default_rng(cfg.seed + 3)
        killed: list[tuple[int, int]] = []
        try:
            for step in range(self.steps):
                victim = grpo.dead_rank(step, self.fault, self.fault_step, self.dp, self.cp)
                if victim is not None and victim in ranks:
                    # it dies between steps, after its last step was delivered
                    ray.get(ranks[victim].flush.remote())
                    ray.kill(ranks.pop(victim))
                    killed.append(victim)
                prompts = prompt_rng.choice(cfg.num_prompts, size=cfg.prompts_per_step,
                                            replace=False)
                batch = ray.get(rollout.generate.remote(step, prompts))
                adv = ray.get(reward.score.remote(step, batch))
                lr = grpo.learning_rate(cfg, step, self.fault, self.fault_step)
                theta_old = ray.put(trainer.theta)
                ray.get([r.begin.remote(batch, adv, theta_old) for r in ranks.values()])
                norms = []
                for m in range(cfg.epochs * cfg.minibatches):
                    theta = theta_old if m == 0 else ray.put(trainer.theta)
                    out = ray.get([r.minibatch.remote(m, theta) for r in ranks.values()])
                    # the all-reduce of gradient shards and token counts, then the update
                    grad_sum = np.zeros_like(trainer.theta)
                    for rows, values, _ in out:
                        grad_sum[rows] += values
                    tokens = sum(n for _, _, n in out)
                    if killed:  # the dead rank's shard is lost; rescale as an elastic job would
                        tokens *= (len(ranks) + len(killed)) / len(ranks)
                    norms.append(trainer.apply(grad_sum, tokens, lr))
                ray.get([r.finish.remote(step, norms, lr) for r in ranks.values()])
                trainer.version = step + 1
                if grpo.weights_synced(step, self.fault, self.fault_step):
                    ray.get(rollout.sync.remote(trainer.theta, trainer.version))
                if on_step is not None:
                    on_step(step)
            flushed = ray.get([a.flush.remote() for a in (*ranks.values(), rollout, reward)])
            # the end of training: every Reporter closes (a clean end, said by each rank)
            ray.get([a.close.remote() for a in (*ranks.values(), rollout, reward)])
        finally:
            for actor in (*ranks.values(), rollout, reward):
                ray.kill(actor)
        return {"flushed": all(flushed), "killed": [{"dp": d, "cp": c} for d, c in killed]}
