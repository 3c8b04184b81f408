"""SkyRL integration against replayed metric streams (SkyRL needs GPUs to train).

Numbers come from SkyRL's own CPU tests and reduction code (snapshot a9564572eb8e):
``tests/backends/skyrl_train/utils/test_ppo_utils.py`` (loss-reduction modes),
``tests/backends/skyrl_train/workers/test_policy_worker_loss_scaling.py`` (sum over DP: 72) and
``skyrl/backends/skyrl_train/workers/worker_utils.py`` (``reduce_metrics`` /
``all_reduce_metrics``: ``*_loss`` summed over micro-batches and DP, averaged over mini-batches).
"""

from __future__ import annotations

import numpy as np
import pytest

from rlmon.actors.integrations import skyrl
from rlmon.service.metrics import catalog
from tests.support.integrations_support import Hub

ADV = np.array([[2, 4], [6, 8], [10, 12], [14, 16]], dtype=float)
MASK = np.array([[1, 1], [1, 0], [1, 1], [1, 1]], dtype=float)
EXPECTED = {  # test_token_mean_legacy inputs; the other modes derived by hand in skyrl.md §4.2
    "token_mean": 64 / 7,
    "sequence_mean": 8.75,
    "seq_mean_token_sum_norm": 8.0,
    "token_mean_legacy": 8.5,
}


@pytest.fixture
def hub():
    h = Hub()
    yield h
    h.close()


@pytest.mark.parametrize("mode", skyrl.LOSS_REDUCTIONS)
def test_loss_partial_reproduces_skyrl_modes(mode: str) -> None:
    s, c = skyrl.loss_partial(ADV, MASK, mode, micro_batch_size=2, max_seq_len=2)
    assert s / c == pytest.approx(EXPECTED[mode])


@pytest.mark.parametrize("mode", skyrl.LOSS_REDUCTIONS)
def test_worker_path_dp2_cp2_pools_within_minibatch_and_counts_cp_once(hub: Hub, mode: str):
    """Mini-batch 0 is the SkyRL test batch split over DP=2 (two rows each, one micro-batch per
    rank); mini-batch 1 is the same batch x 3. CP replicas send identical numbers."""
    paths = []
    for dp in range(2):
        for cp in range(2):
            rep = hub.reporter("sk", "actor", rank={"dp": dp, "cp": cp}, world={"dp": 2, "cp": 2})
            paths.append((dp, skyrl.WorkerPath("sk", loss_reduction=mode, dp_rank=dp, dp_size=2,
                                               cp_rank=cp, cp_size=2, micro_batch_size=2,
                                               max_seq_len=2, reporter=rep)))
    for dp, path in paths:
        rows = slice(2 * dp, 2 * dp + 2)
        path.micro_batch(MASK[rows], minibatch=0, per_token_loss=ADV[rows], entropy=ADV[rows] / 10)
        path.micro_batch(MASK[rows], minibatch=1, per_token_loss=3 * ADV[rows],
                         entropy=ADV[rows] / 10)
        path.end_step(0)
    rec = hub.step("actor", 0)
    assert rec.complete and not rec.replica_mismatches
    assert rec.metrics[catalog.LOSS] == pytest.approx((EXPECTED[mode] + 3 * EXPECTED[mode]) / 2)
    m = MASK > 0
    assert rec.metrics[catalog.ENTROPY] == pytest.approx((ADV / 10)[m].mean())  # pooled tokens


def test_skyrl_policy_loss_partials_sum_over_dp_once_per_cp_group(hub: Hub) -> None:
    """test_policy_worker_loss_scaling: rank micro-batch sums 20 and 52 -> 72; with CP=2 the
    #1420 bug reported 144 (each CP replica summed). A second mini-batch (8 + 0) averages in."""
    sums = {0: (20.0, 8.0), 1: (52.0, 0.0)}
    for dp in range(2):
        for cp in range(2):
            rep = hub.reporter("sk", "actor", rank={"dp": dp, "cp": cp}, world={"dp": 2, "cp": 2})
            path = skyrl.WorkerPath("sk", dp_rank=dp, dp_size=2, cp_rank=cp, cp_size=2,
                                    reporter=rep)
            for mb_value in (sums[dp][0] / 2, sums[dp][0] / 2):  # two micro-batches
                path.policy_loss(mb_value, minibatch=0)
            path.policy_loss(sums[dp][1], minibatch=1)
            path.optimizer_step(0, grad_norm=2.0)
            path.optimizer_step(1, grad_norm=4.0)
            path.end_step(1)
    rec = hub.step("actor", 1).metrics
    assert rec[skyrl.POLICY_LOSS] == pytest.approx((72.0 + 8.0) / 2)
    assert rec[catalog.GRAD_NORM] == pytest.approx(3.0)


def test_cp_replicas_that_disagree_are_flagged(hub: Hub) -> None:
    for cp, value in ((0, 3.0), (1, 3.5)):
        rep = hub.reporter("sk", "actor", rank={"cp": cp}, world={"cp": 2})
        path = skyrl.WorkerPath("sk", cp_rank=cp, cp_size=2, reporter=rep)
        path.policy_loss(value, minibatch=0)
        path.end_step(2)
    assert skyrl.POLICY_LOSS in hub.step("actor", 2).replica_mismatches


def test_tracker_wrapper_relays_and_delegates(hub: Hub) -> None:
    class Tracking:  # skyrl/train/utils/tracking.py shape: log(data, step, commit)
        def __init__(self):
            self.logged = []

        def log(self, data, step, commit=False):
            self.logged.append((step, commit, dict(data)))

        def log_exception(self, exc):
            return "logged"

    inner = Tracking()
    tracker = skyrl.wrap_tracker(inner, "sk", reporter=hub.reporter("sk", "driver"))
    assert hub.run_info["sk"].framework == "skyrl"  # what to change names its config paths
    tracker.log({"policy/loss_metrics/clip_ratio": 0.2, "policy/policy_loss": 0.3,
                 "policy/rollout_train_logprobs_abs_diff_mean": 0.05}, step=4, commit=False)
    tracker.log({"timing/step": 12.5}, step=4, commit=True)  # fully-async: commit=False first
    tracker.log({"reward/avg_raw_reward": 0.7}, step=5)
    tracker.finish()
    assert [c[:2] for c in inner.logged] == [(4, False), (4, True), (5, False)]
    assert tracker.log_exception(ValueError()) == "logged"
    four = hub.step("driver", 4).metrics
    assert four[catalog.LOGP_DIFF] == pytest.approx(0.05)
    assert four[catalog.STEP_SECONDS] == 12.5
    assert four["skyrl/policy/loss_metrics/clip_ratio"] == 0.2  # mean of means: relayed
    assert four["skyrl/policy/policy_loss"] == 0.3
    assert hub.step("driver", 5).metrics[catalog.REWARD] == pytest.approx(0.7)


def test_is_ratio_ranks_the_worst_sequences_even_split_over_cp(hub: Hub) -> None:
    ratio = np.ones((4, 6))
    ratio[1, 4] = 0.01  # sequence 1's worst token lies in CP shard 1
    ratio[3, 1] = 0.2
    mask = np.ones((4, 6))
    for cp in range(2):
        rep = hub.reporter("sk", "actor", rank={"cp": cp}, world={"cp": 2})
        path = skyrl.WorkerPath("sk", cp_rank=cp, cp_size=2, reporter=rep, samples_k=2)
        shard = slice(3 * cp, 3 * cp + 3)
        path.micro_batch(mask[:, shard], minibatch=0, is_ratio=ratio[:, shard],
                         sample_ids=["u0", "u1", "u2", "u3"])
        path.end_step(5)
    record = hub.step("actor", 5)
    assert [(s, i) for s, i, _ in record.samples[catalog.IS_RATIO_LOWEST]] == [
        (0.01, "u1"), (0.2, "u3")]
    assert catalog.LOGP_DIFF_WORST not in record.samples  # a mean needs the whole sequence
