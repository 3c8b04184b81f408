"""DeepSpeed engine probe with a real DeepSpeed engine on the CPU accelerator.

Skipped when DeepSpeed is not installed, unless RLMON_REQUIRE_EXTRAS=1 (set by `make test-extras`).
The first engine of a machine JIT-compiles an op (about 40 s); later ones take seconds.
"""

from __future__ import annotations

import os

import pytest

from rlmon.service.metrics import catalog
from tests.support.integrations_support import Hub, ServiceHub
from tests.support.network import free_port

pytestmark = [pytest.mark.deepspeed, pytest.mark.slow]

if os.environ.get("RLMON_REQUIRE_EXTRAS") == "1":
    import deepspeed
    import torch
else:
    torch = pytest.importorskip("torch")
    deepspeed = pytest.importorskip("deepspeed")

from rlmon.actors.integrations import deepspeed as rl_ds  # noqa: E402

GAS = 4


@pytest.fixture(scope="module")
def engine():
    # the launcher's variables for this module only: a later test's subprocess (a trainer of
    # its own) must not inherit a MASTER_PORT this process still listens on
    patch = pytest.MonkeyPatch()
    for key, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0",
                       "WORLD_SIZE": "1", "LOCAL_RANK": "0", "DS_ACCELERATOR": "cpu"}.items():
        if key not in os.environ:
            patch.setenv(key, value)
    yield _build(GAS)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    patch.undo()


def _build(gas: int):
    """A DeepSpeed engine on the CPU accelerator (the launcher's variables set)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    config = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": gas,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
        "zero_optimization": {"stage": 0},
        "gradient_clipping": 1.0,
    }
    eng, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                   config=config)
    return eng


def _batch(i: int):
    g = torch.Generator().manual_seed(i)
    return torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g)


def test_deepspeed_scales_the_loss_by_gas_and_the_comparable_view_undoes_it(engine) -> None:
    """Seed 000: the same micro-batch, backward GAS times. Plain torch accumulates GAS x grad;
    DeepSpeed accumulates grad (loss / GAS each time): its effective loss is 1/GAS of plain."""
    x, y = _batch(0)
    plain = [p.detach().clone().requires_grad_(True) for p in engine.module.parameters()]

    def forward(params, inp):
        h = torch.tanh(inp @ params[0].T + params[1])
        return h @ params[2].T + params[3]

    for _ in range(GAS):
        torch.nn.functional.mse_loss(forward(plain, x), y).backward()
    for _ in range(GAS):
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        if _ < GAS - 1:
            engine.step()  # not a boundary: no optimizer step yet
    ds_grad = next(engine.module.parameters()).grad.detach().clone()
    ratio = (plain[0].grad / ds_grad).flatten()
    assert torch.allclose(ratio, torch.full_like(ratio, float(GAS)), rtol=1e-4)
    engine.step()  # the boundary: optimizer step, gradients consumed
    hub = Hub()
    probe = rl_ds.EngineProbe(engine, reporter=hub.reporter("ds", "actor"), algorithm="sft")
    assert probe.normalization.gradient_accumulation_steps == GAS
    assert probe.normalization.zero_stage == 0
    forward = float(loss.item())  # docs/integrations.md's usage: the loss as the user computed it
    snap = probe.record(1, loss=loss.item())
    rec = hub.step("actor", 1).metrics
    assert snap.global_steps == 1 and snap.skipped_steps == 0 and snap.loss_scale is None
    assert rec[catalog.SKIPPED_STEPS] == 0
    assert rec[catalog.LOSS] == pytest.approx(forward)  # comparable with the plain-torch run
    assert rec[rl_ds.LOSS_SCALED] == pytest.approx(forward / GAS)  # what DeepSpeed propagates
    # DeepSpeed's own 1/gas view, named as such, lands on the same comparable loss
    probe.record(2, scaled_loss=forward / GAS)
    two = hub.step("actor", 2).metrics
    assert two[catalog.LOSS] == pytest.approx(forward)
    with pytest.raises(ValueError, match="not both"):
        probe.record(3, loss=forward, scaled_loss=forward / GAS)
    if snap.global_grad_norm is not None:
        assert rec[catalog.GRAD_NORM] == pytest.approx(snap.global_grad_norm)
        assert snap.global_grad_norm > 0
    meta = probe.normalization.as_metadata()
    assert meta["comparable_loss_factor"] == GAS and meta["deepspeed_version"]
    info = hub.run_info["ds"]  # run metadata, not deepspeed/* metrics
    assert (info.framework, info.zero_stage, info.grad_accumulation) == ("deepspeed", 0, GAS)
    assert info.deepspeed_version == deepspeed.__version__ == info.framework_version
    assert info.algorithm == "sft" and info.dp == 1
    assert not any(name.startswith("deepspeed/") and name != rl_ds.LOSS_SCALED for name in rec)
    hub.close()


def test_a_closed_probe_ends_cleanly_and_pages_nothing(engine, tmp_path) -> None:
    """The end of training closes the probe's Reporter (``close()``, or ``engine.destroy()``):
    the run reads finished and no stall or death pages after its last step."""
    hub = ServiceHub(tmp_path)
    try:
        probe = rl_ds.EngineProbe(engine, reporter=hub.reporter("ds-end", "actor"),
                                  total_steps=3)
        assert probe.reporter.total_steps == 3
        for step in range(3):
            x, y = _batch(step)
            loss = torch.nn.functional.mse_loss(engine(x), y)
            engine.backward(loss)
            engine.step()
            probe.record(step, loss=loss.item())
        probe.close()
        assert hub.pages_after(150) == []
        assert hub.states()[("ds-end", "actor")] == "finished"
    finally:
        hub.close()


def test_engine_destroy_closes_every_probe_of_the_engine_and_pages_nothing(engine,
                                                                            tmp_path) -> None:
    """DeepSpeed's own end of an engine, ``engine.destroy()``, closes its probes' Reporters (two
    probes on one engine: both), so the runs read finished and nothing pages after the silence.
    An engine of its own: destroy frees it (the module's engine serves the other tests)."""
    own = _build(1)
    hub = ServiceHub(tmp_path)
    try:
        probes = [rl_ds.EngineProbe(own, reporter=hub.reporter(run, "actor"), total_steps=3)
                  for run in ("ds-destroy", "ds-destroy-2")]
        for step in range(3):
            x, y = _batch(step)
            loss = torch.nn.functional.mse_loss(own(x), y)
            own.backward(loss)
            own.step()
            for probe in probes:
                probe.record(step, loss=loss.item())
        own.destroy()
        assert hub.pages_after(150) == []
        states = hub.states()  # an open Reporter past its planned last step would read running
        assert (states[("ds-destroy", "actor")], states[("ds-destroy-2", "actor")]) == (
            "finished", "finished")
    finally:
        hub.close()
