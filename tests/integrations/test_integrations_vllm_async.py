"""``AsyncLLM`` generating for real with rlmon loaded by vLLM itself (the entry point
``vllm.stat_logger_plugins``), through the real rlmon runtime on Ray: steps follow ``set_step``,
the step open at ``shutdown`` is sent, and rlmon's token total equals vLLM's own counter.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest

from rlmon.service.metrics import catalog
from tests.support.extras import optional_import
from tests.support.polling import wait_for
from tests.support.vllm_support import tiny_model_module, vllm_counter

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.ray]

optional_import("vllm")

from rlmon.actors.integrations import vllm as rl_vllm  # noqa: E402

STEPS = (4, 5, 6)


async def _rollouts(model: Any, prompts: list[str], kwargs: dict[str, Any]) -> tuple[dict[int, int],
                                                                                   float]:
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    engine = AsyncLLM.from_engine_args(
        AsyncEngineArgs(model=model.model, tokenizer=model.tokenizer, **kwargs))
    loggers = rl_vllm.attach(engine)  # finds the plugin's logger; shutdown() will send the step
    assert len(loggers) == 1 and loggers[0].reporter.run.startswith("vllm-async-")
    params = SamplingParams(max_tokens=24, temperature=1.0, seed=5)

    async def one(request_id: str, prompt: str) -> int:
        final = None
        async for out in engine.generate(prompt, params, request_id=request_id):
            final = out
        assert final is not None and final.finished
        return len(final.outputs[0].token_ids)

    before = vllm_counter("vllm:generation_tokens")
    per_step = {}
    for step in STEPS:
        rl_vllm.set_step(step)
        counts = await asyncio.gather(*(one(f"{step}-{i}", p) for i, p in enumerate(prompts)))
        per_step[step] = sum(counts)
    counted = vllm_counter("vllm:generation_tokens") - before
    engine.shutdown()  # sends step 6: nothing else would before the process exits
    return per_step, counted


def test_async_llm_through_ray_counts_every_token(ray_cluster: Any, ray_namespace: str,
                                                  tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from rlmon.actors.runtime import RuntimeOptions, ensure_runtime, shutdown_runtime

    ray = ray_cluster
    service = ensure_runtime(ray_namespace, RuntimeOptions(state_dir=str(tmp_path), port=0))
    run = f"vllm-async-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("RLMON_RUN", run)  # what the plugin reads: docs/integrations.md's setup
    monkeypatch.setenv("RLMON_NAMESPACE", ray_namespace)
    monkeypatch.delenv("RLMON_SINK_JSONL", raising=False)
    tiny = tiny_model_module()
    model = tiny.build_tiny_model(str(tmp_path / "tiny"))
    try:
        per_step, counted = asyncio.run(_rollouts(model, tiny.PROMPTS, tiny.ENGINE_KWARGS))
    finally:
        rl_vllm.set_step(None)
    steps = wait_for(lambda: (got := ray.get(service.steps.remote(run))) and len(got) == 3
                     and got, 60.0, "three vllm steps at the service")
    assert [s["step"] for s in steps] == list(STEPS) and all(s["complete"] for s in steps)
    reported = {s["step"]: s["metrics"][catalog.TOKENS] for s in steps}
    print(f"AsyncLLM tokens: rlmon {sum(reported.values()):g}, vLLM vllm:generation_tokens "
          f"{counted:g}, outputs {sum(per_step.values())}")
    assert reported == per_step
    assert sum(reported.values()) == counted > 0
    for s in steps:
        m = s["metrics"]
        assert 0 < m[catalog.NUM_RUNNING_REQS] <= m[catalog.NUM_RUNNING_REQS_MAX] <= len(tiny.PROMPTS)
        assert 0 < m[catalog.KV_CACHE_USAGE] <= m[catalog.KV_CACHE_USAGE_MAX] <= 1
    assert shutdown_runtime(ray_namespace)
