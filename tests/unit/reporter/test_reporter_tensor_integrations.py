"""The OpenRLHF and SkyRL worker paths on torch tensors take the device path: no host sync per
micro-batch, the same numbers as the host reference."""

from __future__ import annotations

import numpy as np
import pytest

from rlmon.actors.integrations import openrlhf, skyrl
from rlmon.actors.reporter import Reporter
from rlmon.actors.reporter.sink import LocalSink
from rlmon.service.metrics import catalog
from tests.support.extras import optional_import

pytestmark = pytest.mark.torch
torch = optional_import("torch")


def _reporter(sink: LocalSink) -> Reporter:
    return Reporter("w", "actor", rank={"dp": 0}, world={"dp": 1}, sink=sink, step_seconds=False,
                    hardware_interval=None)  # the step holds what the test recorded, nothing else


def _batch(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    loss = rng.standard_normal((6, 5)).astype(np.float32)
    mask = (rng.random((6, 5)) < 0.6).astype(np.float32)
    mask[2] = 0.0  # a sequence without tokens
    return loss, mask


@pytest.mark.parametrize("mode", skyrl.LOSS_REDUCTIONS)
def test_skyrl_loss_units_pool_to_the_host_partial(mode: str) -> None:
    loss, mask = _batch(0)
    s, c = skyrl.loss_partial(loss, mask, mode, micro_batch_size=4, max_seq_len=5)
    values, units_mask = skyrl.loss_units(torch.tensor(loss), torch.tensor(mask), mode,
                                          micro_batch_size=4, max_seq_len=5)
    picked = values if units_mask is None else values[units_mask]
    assert float(picked.double().sum()) == pytest.approx(s, rel=1e-12, abs=1e-12)
    assert float(picked.numel()) == c


@pytest.mark.parametrize("mode", skyrl.LOSS_REDUCTIONS)
def test_skyrl_worker_path_on_torch_equals_numpy(mode: str) -> None:
    results = []
    for as_torch in (False, True):
        sink = LocalSink()
        rep = _reporter(sink)
        path = skyrl.WorkerPath("w", loss_reduction=mode, micro_batch_size=2, max_seq_len=5,
                                reporter=rep)
        for mb in range(3):
            loss, mask = _batch(mb)
            conv = torch.tensor if as_torch else np.asarray
            path.micro_batch(conv(mask), minibatch=mb % 2, per_token_loss=conv(loss),
                             entropy=conv(np.abs(loss)))
        path.end_step(0)
        assert rep.flush(10)
        results.append(sink.records[0].metrics)
        assert rep.transfers == (1 if as_torch else 0)
    host, device = results
    assert device.keys() == host.keys()
    for name in host:
        assert device[name] == pytest.approx(host[name], rel=1e-6), name


def test_openrlhf_micro_batch_holds_nothing_after_the_call() -> None:
    sink = LocalSink()
    rep = _reporter(sink)
    path = openrlhf.WorkerPath("w", dp_rank=0, dp_size=1, reporter=rep)
    loss, mask = _batch(1)
    path.micro_batch(torch.tensor(mask), policy_loss=torch.tensor(loss),
                     entropy=torch.tensor(np.abs(loss)))
    assert not rep._tensors._groups  # folded in the call: nothing held
    path.end_step(0)
    assert rep.flush(10)
    m = mask.astype(bool)
    assert sink.records[0].metrics[catalog.LOSS] == pytest.approx(
        float(loss[m].astype(np.float64).mean()), rel=1e-12)
