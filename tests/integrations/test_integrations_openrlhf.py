"""OpenRLHF integration against replayed metric streams (OpenRLHF needs GPUs to train).

The replay reproduces the documented arithmetic of OpenRLHF v0.11.0:
``openrlhf/trainer/ray/ppo_actor.py`` (ActorPPOTrainer.ppo_train: per-micro-batch loss
normalized by the accumulation window's global token count, then token-weighted again) and
``openrlhf/models/loss.py`` (rho = exp(old_logp - rollout_logp), tis clamps / icepop zeroes
outside [low, high]).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from rlmon.actors.integrations import openrlhf
from rlmon.service.metrics import catalog
from tests.support.integrations_support import Hub


@pytest.fixture
def hub():
    h = Hub()
    yield h
    h.close()


@dataclass
class Experience:  # the fields of openrlhf/trainer/ppo_utils/experience.py the hook reads
    action_log_probs: np.ndarray
    rollout_log_probs: np.ndarray | None
    action_mask: np.ndarray


def _batch(rng: np.random.Generator, rows: int, width: int) -> Experience:
    old = rng.normal(-1.0, 0.5, (rows, width))
    roll = old + rng.normal(0.0, 0.4, (rows, width))
    lengths = rng.integers(1, width + 1, rows)
    mask = (np.arange(width)[None, :] < lengths[:, None]).astype(np.float64)
    roll = np.where(mask > 0, roll, 0.0)  # OpenRLHF stores 0.0 outside action tokens
    return Experience(old, roll, mask)


def test_importance_stats_match_numpy_reference() -> None:
    rng = np.random.default_rng(0)
    exp = _batch(rng, 6, 9)
    s = openrlhf.importance_stats(exp.action_log_probs, exp.rollout_log_probs, exp.action_mask,
                                  low=0.5, high=2.0)
    m = exp.action_mask > 0
    rho = np.exp(exp.action_log_probs - exp.rollout_log_probs)[m]
    assert s["tokens"] == m.sum()
    assert s["ratio_sum"] / s["tokens"] == pytest.approx(rho.mean())
    assert (s["ratio_min"], s["ratio_max"]) == pytest.approx((rho.min(), rho.max()))
    assert s["masked"] == ((rho < 0.5) | (rho > 2.0)).sum()
    seq = openrlhf.importance_stats(exp.action_log_probs, exp.rollout_log_probs, exp.action_mask,
                                    low=0.9, high=1.1, mode="seq-mask-tis")
    lr = np.where(m, exp.action_log_probs - exp.rollout_log_probs, 0.0)
    geo = np.exp(lr.sum(1) / m.sum(1))
    assert seq["masked"] == m.sum(1)[(geo < 0.9) | (geo > 1.1)].sum()
    with pytest.raises(ValueError, match="mode"):
        openrlhf.importance_stats(exp.action_log_probs, exp.rollout_log_probs, exp.action_mask,
                                  mode="bogus")


def test_logger_relays_status_and_driver_hook_is_exact(hub: Hub) -> None:
    rng = np.random.default_rng(1)
    batches = [_batch(rng, 4, 12) for _ in range(3)]
    batches.append(Experience(batches[0].action_log_probs, None, batches[0].action_mask))
    logger = openrlhf.RlmonLogger("or-run", reporter=hub.reporter("or-run", "driver"),
                                  eval_reporter=hub.reporter("or-run", "eval"), is_high=2.0)
    assert hub.run_info["or-run"].framework == "openrlhf"  # what to change names its flags
    logger.record_experiences(batches)
    status = {"policy_loss": -0.02, "ppo_clip_ratio": 0.12, "actor_lr": 1e-6, "kl": 0.01,
              "rollout/reward_mean": 0.4, "generated_samples": ["text", 1.0],
              "custom_key": 3.0}
    logger.log_train(7, status)
    logger.log_eval(7, {"eval_gsm8k_pass1": 0.5})
    rec = hub.step("driver", 7).metrics
    assert rec["actor/clip_ratio"] == pytest.approx(0.12)
    assert rec["rollout/reward"] == pytest.approx(0.4)
    assert rec["openrlhf/policy_loss"] == pytest.approx(-0.02)  # not comparable: relayed as is
    assert "actor/loss" not in rec and rec["openrlhf/kl"] == pytest.approx(0.01)
    assert rec["openrlhf/custom_key"] == 3.0 and "openrlhf/generated_samples" not in rec
    old = np.concatenate([b.action_log_probs for b in batches[:3]])
    roll = np.concatenate([b.rollout_log_probs for b in batches[:3]])
    m = np.concatenate([b.action_mask for b in batches[:3]]) > 0
    rho = np.exp(old - roll)[m]
    assert rec[catalog.IS_RATIO] == pytest.approx(rho.mean(), rel=1e-12)
    assert rec[catalog.IS_RATIO_MIN] == pytest.approx(rho.min())
    assert rec[catalog.IS_RATIO_MAX] == pytest.approx(rho.max())
    assert rec[catalog.LOGP_DIFF] == pytest.approx(np.abs(old - roll)[m].mean())
    assert rec[catalog.IS_MASKED_FRAC] == pytest.approx(((rho < 0.5) | (rho > 2.0)).mean())
    assert hub.step("eval", 7).metrics["openrlhf/eval/eval_gsm8k_pass1"] == 0.5


def test_attach_wraps_the_trainer_hooks(hub: Hub) -> None:
    """A stand-in for BasePPOTrainer with the two methods ppo_trainer.py calls."""
    rng = np.random.default_rng(2)
    exp = _batch(rng, 3, 5)
    calls = []

    class Maker:
        def make_experience_batch(self, samples):
            return [exp]

    class Trainer:
        experience_maker = Maker()

        def save_logs_and_checkpoints(self, global_step, logs, client_states=None):
            calls.append((global_step, dict(logs)))

    trainer = Trainer()
    openrlhf.attach(trainer, "or-run", reporter=hub.reporter("or-run", "driver"))
    trainer.experience_maker.make_experience_batch(None)
    trainer.save_logs_and_checkpoints(3, {"ppo_kl": 0.001}, {})
    assert calls == [(3, {"ppo_kl": 0.001})]
    rec = hub.step("driver", 3).metrics
    assert rec["actor/approx_kl"] == pytest.approx(0.001)
    m = exp.action_mask > 0
    assert rec[catalog.IS_RATIO] == pytest.approx(
        np.exp(exp.action_log_probs - exp.rollout_log_probs)[m].mean())


def _openrlhf_logged_policy_loss(losses, masks, gas: int) -> float:
    """ppo_actor.py arithmetic: each micro-batch value is its masked loss sum divided by the
    window's global token count times dp x gas, then token-weighted over ranks and windows."""
    dp = len(losses)
    num = den = 0.0
    n_mb = len(losses[0])
    for w in range(0, n_mb, gas):
        window_tokens = sum(masks[r][i].sum() for r in range(dp) for i in range(w, w + gas))
        for r in range(dp):
            for i in range(w, w + gas):
                value = (losses[r][i] * masks[r][i]).sum() / window_tokens * dp * gas
                num += value * masks[r][i].sum()
                den += masks[r][i].sum()
    return num / den


def test_worker_path_is_exact_where_openrlhf_is_biased(hub: Hub) -> None:
    """DP=2 x SP=2, uneven token counts (5..400): only SP leaders report, the world is DP."""
    rng = np.random.default_rng(3)
    dp, sp, gas, n_mb = 2, 2, 2, 4
    losses = [[rng.normal(1.0 + r, 1.0, 400) for _ in range(n_mb)] for r in range(dp)]
    masks = [[(np.arange(400) < rng.integers(5, 401)).astype(float) for _ in range(n_mb)]
             for _ in range(dp)]
    paths = []
    for r in range(dp):
        for s in range(sp):
            rep = hub.reporter("or-run", "actor", rank={"dp": r}, world={"dp": dp}) if s == 0 else None
            paths.append((r, openrlhf.WorkerPath("or-run", dp_rank=r, dp_size=dp, sp_rank=s,
                                                 reporter=rep)))
    assert [p.leader for _, p in paths] == [True, False, True, False]
    for r, path in paths:
        for i in range(n_mb):
            path.micro_batch(masks[r][i], policy_loss=losses[r][i],
                             clipped=(losses[r][i] > 2.0).astype(float))
        path.optimizer_step(0, grad_norm=1.0, lr=1e-6)
        path.optimizer_step(1, grad_norm=3.0, lr=2e-6)
        path.end_step(5)
    rec = hub.step("actor", 5)
    assert rec.complete and rec.ranks_expected == dp
    every_loss = np.concatenate([losses[r][i][masks[r][i] > 0] for r in range(dp)
                                 for i in range(n_mb)])
    exact = every_loss.mean()
    assert rec.metrics["actor/loss"] == pytest.approx(exact, rel=1e-12)
    assert rec.metrics["actor/clip_ratio"] == pytest.approx((every_loss > 2.0).mean())
    assert rec.metrics["actor/grad_norm"] == pytest.approx(2.0)  # mean over optimizer steps
    assert rec.metrics["actor/lr"] == 2e-6
    logged = _openrlhf_logged_policy_loss(losses, masks, gas)
    assert abs(logged - exact) / abs(exact) > 0.05  # what OpenRLHF shows is off by > 5 %


def test_driver_hook_ranks_the_worst_sequences_across_experiences(hub: Hub) -> None:
    rng = np.random.default_rng(4)
    batches = [_batch(rng, 4, 12) for _ in range(3)]
    corrupt = batches[1]
    corrupt.rollout_log_probs[2] = np.where(corrupt.action_mask[2] > 0,
                                            corrupt.action_log_probs[2] + 3.0, 0.0)
    described: list[tuple[int, int]] = []

    def payload(exp: Experience, i: int) -> str:
        (j,) = [j for j, b in enumerate(batches) if b is exp]
        described.append((j, i))
        return f"batch {j} sequence {i}"

    logger = openrlhf.RlmonLogger("or-run", reporter=hub.reporter("or-run", "driver"),
                                  samples_k=2, sample_payload=payload)
    logger.record_experiences(batches)
    logger.log_train(3, {})
    record = hub.step("driver", 3)
    worst = record.samples[catalog.LOGP_DIFF_WORST]
    assert worst[0][1:] == ("dp0/6", "batch 1 sequence 2")  # the 7th sequence the driver saw
    assert worst[0][0] == pytest.approx(3.0)
    lowest = record.samples[catalog.IS_RATIO_LOWEST]
    assert lowest[0][1] == "dp0/6" and lowest[0][0] == pytest.approx(np.exp(-3.0))
    assert len(described) <= 4 * len(batches)  # asked for the kept few of each batch only
    assert record.metrics[catalog.LOGP_DIFF_WORST] == worst[0][0]


def test_worker_path_ranks_sequences_by_mismatch_on_leaders_only(hub: Hub) -> None:
    rng = np.random.default_rng(5)
    for sp in range(2):  # an SP pair holds the same micro-batch: only the leader reports
        rep = hub.reporter("or-run", "actor", rank={"dp": 0}, world={"dp": 1}) if sp == 0 \
            else None
        path = openrlhf.WorkerPath("or-run", dp_rank=0, dp_size=1, sp_rank=sp, reporter=rep,
                                   samples_k=1)
        exp = _batch(rng, 3, 5)
        log_ratio = np.where(exp.action_mask > 0, exp.action_log_probs - exp.rollout_log_probs, 0)
        log_ratio[0] = np.where(exp.action_mask[0] > 0, 4.0, 0.0)
        path.micro_batch(exp.action_mask, log_ratio=log_ratio, sample_ids=["a", "b", "c"],
                         sample_payload=lambda i: f"text {i}")
        path.end_step(0)
    record = hub.step("actor", 0)
    assert record.samples[catalog.LOGP_DIFF_WORST] == ((4.0, "a", "text 0"),)
    assert record.samples[catalog.IS_RATIO_LOWEST][0][0] < 1.0
