"""SkyRL's own loss and metric functions on CPU tensors, against rlmon's SkyRL integration.

Driven (``skyrl`` 0.3.0, installed without its dependencies):
``skyrl.backends.skyrl_train.utils.ppo_utils`` (``apply_loss_reduction_to_advantages_minibatch``,
``ppo_policy_loss`` with token TIS, ``compute_approx_kl``, ``ppo_critic_loss``),
``...workers.worker_utils`` (``reduce_metrics``, ``compute_minibatch_rollout_logprob_diff_metrics``),
``...utils.torch_utils.masked_mean``, ``skyrl.train.generators.utils`` (``get_rollout_metrics``,
``get_metrics_from_generator_output``), ``skyrl.train.config.AlgorithmConfig`` and the real
``skyrl.train.utils.tracking.Tracking`` (console backend) under rlmon's tracker wrapper.
``skyrl/backends/__init__.py`` is not run: it imports the Tinker backend, whose pydantic models use
``typing.TypedDict`` (pydantic refuses it on Python < 3.12) and which the loss code does not use.

``all_reduce_metrics`` reduces over the DP group with ``strategy.all_reduce`` (mean, min, max,
and sum for ``*_loss``); the simulated ranks live in one process, so the test applies the same
ops with SkyRL's own ``reduce_metrics(..., sum_loss_metrics=True)`` over the ranks' values, and
the trainer's mean over mini-batches with ``reduce_metrics(..., sum_loss_metrics=False)``
(``skyrl/train/trainer.py``).

The step: DP=2 x CP=2 (CP replicas hold the same samples), 2 mini-batches, 2 micro-batches of 2
sequences per rank and mini-batch, 1..12 loss tokens per sequence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from rlmon.actors.integrations import skyrl
from rlmon.service.metrics import catalog
from tests.support.frameworks_support import (
    Ledger,
    check_row_coverage,
    framework_module,
    optional_import,
)
from tests.support.integrations_support import Hub

pytestmark = pytest.mark.frameworks

torch = optional_import("torch")
# skyrl/backends/__init__.py imports the Tinker backend (pydantic models on typing.TypedDict,
# refused by pydantic on Python < 3.12); the skyrl_train loss utilities below do not need it.
_SKIP = ("skyrl.backends",)
ppo = framework_module("skyrl.backends.skyrl_train.utils.ppo_utils", skip_init=_SKIP)
wu = framework_module("skyrl.backends.skyrl_train.workers.worker_utils", skip_init=_SKIP)
tu = framework_module("skyrl.backends.skyrl_train.utils.torch_utils", skip_init=_SKIP)
# skyrl/train/generators/__init__.py imports the VLM generator, which imports the same Tinker types
gen = framework_module("skyrl.train.generators.utils", skip_init=(*_SKIP, "skyrl.train.generators"))
config_mod = framework_module("skyrl.train.config", skip_init=_SKIP)
tracking = framework_module("skyrl.train.utils.tracking", skip_init=_SKIP)

DP, CP, N_MINI, N_MICRO, MB_SIZE, WIDTH = 2, 2, 2, 2, 2, 12
REL = 1e-6  # safe_exp_delta (ratio and IS ratio) exponentiates in float32 whatever the input
STEP = 3
TIS_CAP = 2.0

ROW_CHECKS = {
    "policy/policy_loss": "test_policy_loss_per_loss_reduction",
    "policy/final_loss": "test_token_metrics_and_tracker_relays",
    "policy/policy_entropy": "test_token_metrics_and_tracker_relays",
    "policy/policy_kl": "test_token_metrics_and_tracker_relays",
    "policy/loss_metrics/clip_ratio": "test_token_metrics_and_tracker_relays",
    "policy/loss_metrics/is_ratio_mean": "test_token_metrics_and_tracker_relays",
    "policy/loss_metrics/is_ratio_max": "test_token_metrics_and_tracker_relays",
    "policy/loss_metrics/is_ratio_min": "test_token_metrics_and_tracker_relays",
    "policy/policy_lr": "test_token_metrics_and_tracker_relays",
    "policy/rollout_train_logprobs_abs_diff_mean": "test_driver_metrics_through_the_tracker",
    "policy/rollout_train_logprobs_abs_diff_max": "test_driver_metrics_through_the_tracker",
    "reward/avg_raw_reward": "test_driver_metrics_through_the_tracker",
    "generate/avg_num_tokens": "test_driver_metrics_through_the_tracker",
    "critic/critic_loss": "test_critic_loss_is_a_mean_of_means",
    "policy/grad_norm": "",
    "timing/step": "",
}


@dataclass
class Shard:
    """One micro-batch (rows of one DP rank's share of a mini-batch)."""

    new: Any
    old: Any
    rollout: Any
    base: Any
    adv: Any  # raw advantages
    scaled: Any  # pre-scaled by apply_loss_reduction_to_advantages_minibatch
    entropy: Any
    mask: Any


def _config() -> Any:
    cfg = config_mod.AlgorithmConfig()
    cfg.eps_clip_low, cfg.eps_clip_high = 0.2, 0.28
    cfg.off_policy_correction.tis_ratio_type = "token"
    cfg.off_policy_correction.token_tis_ratio_clip_high = TIS_CAP
    return cfg


def _step(seed: int, mode: str) -> list[list[list[Shard]]]:
    """[mini-batch][dp rank][micro-batch]; advantages scaled over each whole mini-batch."""
    rng = np.random.default_rng(seed)
    t = lambda a: torch.tensor(a, dtype=torch.float64)  # noqa: E731
    rows = DP * N_MICRO * MB_SIZE
    out = []
    for _ in range(N_MINI):
        # every other micro-batch holds short sequences (1..3 tokens) whose tokens drift more:
        # a mean of micro-batch means then weighs their few tokens as much as the long ones
        short = (np.arange(rows) // MB_SIZE) % 2 == 0
        lengths = np.where(short, rng.integers(1, 4, rows), rng.integers(9, WIDTH + 1, rows))
        mask = t((np.arange(WIDTH)[None, :] < lengths[:, None]).astype(np.float64))
        drift = np.where(short, 2.0, 1.0)[:, None]
        old = rng.normal(-1.2, 0.5, (rows, WIDTH))
        adv = t(np.repeat(rng.normal(0.0, 1.0, (rows, 1)), WIDTH, axis=1))
        # the driver scales each mini-batch's advantages as one (DP shards are slices of it)
        scaled = ppo.apply_loss_reduction_to_advantages_minibatch(adv, mask, mode, MB_SIZE, WIDTH)
        full = dict(old=t(old), new=t(old + drift * rng.normal(0.0, 0.2, old.shape)),
                    rollout=t(old + drift * rng.normal(0.0, 0.3, old.shape)),
                    base=t(old + drift * rng.normal(0.0, 0.2, old.shape)), adv=adv,
                    scaled=scaled, entropy=t(drift * rng.gamma(2.0, 0.4, old.shape)), mask=mask)
        per_rank = rows // DP
        out.append([[Shard(**{k: v[r * per_rank + m * MB_SIZE: r * per_rank + (m + 1) * MB_SIZE]
                              for k, v in full.items()})
                      for m in range(N_MICRO)] for r in range(DP)])
    return out


def _per_token_loss(cfg: Any, s: Shard) -> Any:
    """The per-token policy loss (with the TIS factor) that ppo_policy_loss sums: its loss is
    ``(loss * loss_mask).sum()``, whose gradient in the mask is the per-token loss."""
    mask = s.mask.clone().requires_grad_(True)
    loss, _ = ppo.ppo_policy_loss(s.new, s.old, s.adv, cfg, loss_mask=mask,
                                  rollout_logprobs=s.rollout)
    (grad,) = torch.autograd.grad(loss, mask)
    return grad.detach()


def _skyrl_reduce(per_rank_lists: list[dict[str, list[float]]]) -> dict[str, float]:
    """forward_backward: reduce_metrics over a rank's micro-batches, then the DP all-reduce."""
    per_rank = [wu.reduce_metrics(m, sum_loss_metrics=True) for m in per_rank_lists]
    return wu.reduce_metrics({k: [r[k] for r in per_rank] for k in per_rank[0]},
                             sum_loss_metrics=True)


def _mode_truth(loss: np.ndarray, mask: np.ndarray, mode: str) -> float:
    """One mini-batch (un-split, float64), reduced as the loss_reduction mode defines it."""
    masked = loss * mask
    if mode == "token_mean":
        return float(masked.sum() / mask.sum())
    if mode == "sequence_mean":
        return float((masked.sum(1) / mask.sum(1)).mean())
    if mode == "seq_mean_token_sum_norm":
        return float(masked.sum(1).mean() / WIDTH)
    chunks = [slice(i, i + MB_SIZE) for i in range(0, len(loss), MB_SIZE)]  # token_mean_legacy
    return float(np.mean([masked[c].sum() / mask[c].sum() for c in chunks]))


def _np_loss(s: Shard) -> np.ndarray:
    ratio = np.exp(s.new.numpy() - s.old.numpy())
    adv = s.adv.numpy()
    tis = np.minimum(np.exp(s.old.numpy() - s.rollout.numpy()), TIS_CAP)
    return -np.minimum(ratio * adv, np.clip(ratio, 0.8, 1.28) * adv) * tis


@pytest.fixture
def hub():
    h = Hub()
    yield h
    h.close()


def _paths(hub: Hub, mode: str) -> list[tuple[int, Any]]:
    return [(dp, skyrl.WorkerPath(
        "sk", loss_reduction=mode, dp_rank=dp, dp_size=DP, cp_rank=cp, cp_size=CP,
        micro_batch_size=MB_SIZE, max_seq_len=WIDTH,
        reporter=hub.reporter("sk", "actor", rank={"dp": dp, "cp": cp},
                              world={"dp": DP, "cp": CP})))
        for dp in range(DP) for cp in range(CP)]


@pytest.mark.parametrize("mode", skyrl.LOSS_REDUCTIONS)
def test_policy_loss_per_loss_reduction(hub: Hub, mode: str) -> None:
    ledger = Ledger("skyrl", rel=REL)
    cfg = _config()
    step = _step(10, mode)
    paths = _paths(hub, mode)
    minibatch_logged, minibatch_world = [], []
    for j, mini in enumerate(step):
        lists: list[dict[str, list[float]]] = []
        for r in range(DP):
            values: dict[str, list[float]] = {"policy_loss": []}
            for s in mini[r]:
                loss, _ = ppo.ppo_policy_loss(s.new, s.old, s.scaled, cfg, loss_mask=s.mask,
                                              rollout_logprobs=s.rollout)
                values["policy_loss"].append(float(loss))
                token_loss = _per_token_loss(cfg, s)
                for rank, path in paths:
                    if rank == r:  # every CP replica of the DP rank
                        path.micro_batch(s.mask, minibatch=j, per_token_loss=token_loss)
                        path.policy_loss(float(loss), minibatch=j)
            lists.append(values)
        minibatch_logged.append(_skyrl_reduce(lists))
        # SkyRL before #1420: the sum all-reduce ran over DP x CP, so each CP replica counted
        minibatch_world.append(_skyrl_reduce([v for v in lists for _ in range(CP)]))
    for _, path in paths:
        path.end_step(STEP)
    logged = wu.reduce_metrics({"policy_loss": [m["policy_loss"] for m in minibatch_logged]})
    world = wu.reduce_metrics({"policy_loss": [m["policy_loss"] for m in minibatch_world]})
    rec = hub.step("actor", STEP)
    assert rec.complete and not rec.replica_mismatches
    truth = float(np.mean([
        _mode_truth(np.concatenate([_np_loss(s) for rank in mini for s in rank]),
                    np.concatenate([s.mask.numpy() for rank in mini for s in rank]), mode)
        for mini in step]))
    ledger.check(catalog.LOSS, f"worker path, {mode}", rec.metrics[catalog.LOSS],
                 framework=logged["policy_loss"], truth=truth)
    ledger.check(skyrl.POLICY_LOSS, f"SkyRL's partial sums, {mode}",
                 rec.metrics[skyrl.POLICY_LOSS], framework=logged["policy_loss"], truth=truth)
    ledger.check(catalog.LOSS, f"sum over DP x CP (#1420), {mode}", rec.metrics[catalog.LOSS],
                 framework=world["policy_loss"], truth=truth, differs_framework=True)


def test_token_metrics_and_tracker_relays(hub: Hub) -> None:
    ledger = Ledger("skyrl", rel=REL)
    cfg = _config()
    cfg.use_kl_loss, cfg.kl_loss_coef, cfg.kl_estimator_type = True, 0.01, "k3"
    mode = "token_mean"
    step = _step(11, mode)
    paths = _paths(hub, mode)
    per_minibatch = []
    for j, mini in enumerate(step):
        lists = []
        rank_rows = sum(s.mask.shape[0] for s in mini[0])
        for r in range(DP):
            values: dict[str, list[float]] = {}
            for s in mini[r]:
                loss, lm = ppo.ppo_policy_loss(s.new, s.old, s.scaled, cfg, loss_mask=s.mask,
                                               rollout_logprobs=s.rollout)
                kl_tok = ppo.compute_approx_kl(s.new, s.base, loss_mask=s.mask,
                                               kl_estimator_type="k3")
                kl = tu.masked_mean(kl_tok, s.mask, dim=-1).mean()
                entropy = tu.masked_mean(s.entropy, s.mask)
                # _forward_backward_micro: unscaled_loss = policy_loss + kl term x mb weight / dp
                weight = s.mask.shape[0] / rank_rows
                status = {"final_loss": float((loss * DP + kl * cfg.kl_loss_coef * weight) / DP),
                          "policy_loss": float(loss), "policy_entropy": float(entropy),
                          "policy_lr": 1e-6, "policy_kl": float(kl)}
                status.update({"loss_metrics/" + k: v for k, v in lm.items()})
                for k, v in status.items():
                    values.setdefault(k, []).append(v)
                ratio = (s.new - s.old).exp()
                clipped = (-ratio.clamp(0.8, 1.28) * s.scaled > -ratio * s.scaled).double()
                for rank, path in paths:
                    if rank == r:
                        path.micro_batch(s.mask, minibatch=j, entropy=s.entropy, kl=kl_tok,
                                         clipped=clipped, is_ratio=(s.old - s.rollout).exp())
            lists.append(values)
        per_minibatch.append(_skyrl_reduce(lists))
    for _, path in paths:
        path.end_step(STEP)
    logged = {"policy/" + k: v for k, v in wu.reduce_metrics(
        {k: [m[k] for m in per_minibatch] for k in per_minibatch[0]}).items()}
    tracker = skyrl.wrap_tracker(tracking.Tracking("p", "e", backend="console"), "sk",
                                 reporter=hub.reporter("sk", "driver"))
    tracker.log(logged, step=STEP, commit=True)
    tracker.finish()
    rec, driver = hub.step("actor", STEP).metrics, hub.step("driver", STEP).metrics

    every = [s for mini in step for rank in mini for s in rank]
    pool = lambda f: np.concatenate([f(s)[s.mask.numpy() > 0] for s in every])  # noqa: E731
    ratio = pool(lambda s: np.exp(s.new.numpy() - s.old.numpy()))
    adv = pool(lambda s: s.adv.numpy())
    rho = pool(lambda s: np.exp(s.old.numpy() - s.rollout.numpy()))
    k3 = pool(lambda s: np.exp(s.base.numpy() - s.new.numpy()) - (s.base.numpy() - s.new.numpy()) - 1)
    truth = {"entropy": float(pool(lambda s: s.entropy.numpy()).mean()), "kl": float(k3.mean()),
             "clip": float((np.clip(ratio, 0.8, 1.28) * adv < ratio * adv).mean()),
             "is_mean": float(rho.mean()), "is_max": float(rho.max()), "is_min": float(rho.min())}
    for key, name, t in (("policy/policy_entropy", catalog.ENTROPY, "entropy"),
                         ("policy/policy_kl", catalog.KL, "kl"),
                         ("policy/loss_metrics/clip_ratio", catalog.CLIP_RATIO, "clip"),
                         ("policy/loss_metrics/is_ratio_mean", catalog.IS_RATIO, "is_mean")):
        ledger.check(name, "worker path", rec[name], framework=logged[key], truth=truth[t],
                     differs_framework=True)
        ledger.check(f"skyrl/{key}", "tracker (mean of micro-batch means)",
                     driver[f"skyrl/{key}"], framework=logged[key], truth=truth[t],
                     differs_truth=True)
    ledger.check(catalog.IS_RATIO_MAX, "tracker", driver[catalog.IS_RATIO_MAX],
                 framework=logged["policy/loss_metrics/is_ratio_max"], truth=truth["is_max"])
    ledger.check("skyrl/policy/loss_metrics/is_ratio_min", "tracker (min of ratio x mask)",
                 driver["skyrl/policy/loss_metrics/is_ratio_min"],
                 framework=logged["policy/loss_metrics/is_ratio_min"], truth=truth["is_min"],
                 differs_truth=True)
    assert driver["skyrl/policy/loss_metrics/is_ratio_min"] == 0.0  # padding positions count
    ledger.check("skyrl/policy/final_loss", "tracker", driver["skyrl/policy/final_loss"],
                 framework=logged["policy/final_loss"])
    ledger.check(catalog.LR, "tracker", driver[catalog.LR], framework=logged["policy/policy_lr"])


def test_driver_metrics_through_the_tracker(hub: Hub) -> None:
    ledger = Ledger("skyrl")
    rng = np.random.default_rng(12)
    n, uids = 16, [f"p{i // 4}" for i in range(16)]
    rewards = [float(x) for x in rng.choice([0.0, 0.5, 1.0], n)]
    responses = [list(range(int(k))) for k in rng.integers(1, 40, n)]
    lengths = rng.integers(1, WIDTH + 1, n)
    mask = torch.tensor((np.arange(WIDTH)[None, :] < lengths[:, None]).astype(np.float64))
    train = torch.tensor(rng.normal(-1.0, 0.5, (n, WIDTH)), dtype=torch.float64)
    rollout = train + torch.tensor(rng.normal(0.0, 0.3, (n, WIDTH)), dtype=torch.float64)
    rollout_metrics = gen.get_rollout_metrics(responses, rewards)
    overall = gen.get_metrics_from_generator_output({"rewards": rewards}, uids)
    # trainer.py computes the forward-pass abs diff inline; the worker's helper has the same
    # definition (masked mean and max of |train - rollout|) and is called on the whole batch
    diff = wu.compute_minibatch_rollout_logprob_diff_metrics(train, rollout, mask)
    logged = {"reward/avg_raw_reward": overall.avg_score if hasattr(overall, "avg_score")
              else overall["avg_score"],
              "generate/avg_num_tokens": rollout_metrics["generate/avg_num_tokens"],
              "policy/rollout_train_logprobs_abs_diff_mean":
                  diff["minibatch_rollout_logprobs_abs_diff_mean"],
              "policy/rollout_train_logprobs_abs_diff_max":
                  diff["minibatch_rollout_logprobs_abs_diff_max"]}
    tracker = skyrl.wrap_tracker(tracking.Tracking("p", "e", backend="console"), "sk",
                                 reporter=hub.reporter("sk", "driver"))
    tracker.log(logged, step=STEP, commit=True)
    tracker.finish()
    rec = hub.step("driver", STEP).metrics
    d = np.abs((train - rollout).numpy())[mask.numpy() > 0]
    for key, name, truth in (
            ("reward/avg_raw_reward", catalog.REWARD, float(np.mean(rewards))),
            ("generate/avg_num_tokens", catalog.RESPONSE_LENGTH,
             float(np.mean([len(r) for r in responses]))),
            ("policy/rollout_train_logprobs_abs_diff_mean", catalog.LOGP_DIFF, float(d.mean())),
            ("policy/rollout_train_logprobs_abs_diff_max", catalog.LOGP_DIFF_MAX, float(d.max()))):
        ledger.check(name, f"tracker ({key})", rec[name], framework=logged[key], truth=truth)


def test_critic_loss_is_a_mean_of_means(hub: Hub) -> None:
    ledger = Ledger("skyrl")
    cfg = _config()
    cfg.value_clip = 0.2
    rng = np.random.default_rng(13)
    t = lambda a: torch.tensor(a, dtype=torch.float64)  # noqa: E731
    lists, v_all, ov_all, ret_all, m_all = [], [], [], [], []
    for _ in range(DP):
        values: dict[str, list[float]] = {"critic_loss": []}
        for _ in range(N_MICRO):
            lengths = rng.integers(1, WIDTH + 1, MB_SIZE)
            mask = (np.arange(WIDTH)[None, :] < lengths[:, None]).astype(np.float64)
            v, ov, ret = (rng.normal(0.3, 0.5, (MB_SIZE, WIDTH)) for _ in range(3))
            loss, _ = ppo.ppo_critic_loss(t(v), t(ov), t(ret), cfg, loss_mask=t(mask))
            values["critic_loss"].append(float(loss))
            v_all.append(v[mask > 0]), ov_all.append(ov[mask > 0]), ret_all.append(ret[mask > 0])
            m_all.append(mask)
        lists.append(values)
    # critic forward_backward: reduce_metrics without sum_loss_metrics, then a mean all-reduce
    per_rank = [wu.reduce_metrics(m) for m in lists]
    logged = {"critic/critic_loss": wu.reduce_metrics(
        {"critic_loss": [r["critic_loss"] for r in per_rank]})["critic_loss"]}
    tracker = skyrl.wrap_tracker(None, "sk", reporter=hub.reporter("sk", "driver"))
    tracker.log(logged, step=STEP, commit=True)
    rec = hub.step("driver", STEP).metrics
    v, ov, ret = (np.concatenate(x) for x in (v_all, ov_all, ret_all))
    clipped = ov + np.clip(v - ov, -0.2, 0.2)
    truth = float(0.5 * np.maximum((clipped - ret) ** 2, (v - ret) ** 2).mean())
    ledger.check("skyrl/critic/critic_loss", "tracker", rec["skyrl/critic/critic_loss"],
                 framework=logged["critic/critic_loss"], truth=truth, differs_truth=True)
    assert catalog.CRITIC_LOSS not in rec


def test_every_skyrl_row_is_checked_or_says_why() -> None:
    check_row_coverage("skyrl", ROW_CHECKS, globals())
