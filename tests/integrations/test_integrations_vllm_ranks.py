"""vLLM engine ranks without vLLM: separate rollout engines (OpenRLHF / verl layout) each get a
distinct rank from RLMON_VLLM_ENGINE_RANK / RLMON_VLLM_ENGINES, and two engines claiming one rank
fail loudly (in one process and across processes) instead of one being dropped as a duplicate."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid
from types import SimpleNamespace as NS

import pytest

from rlmon.actors.integrations import vllm as rl_vllm
from rlmon.service.metrics import catalog
from tests.support.integrations_support import Hub
from tests.support.paths import REPO


def _sched(running: int, waiting: int, kv: float, queries: int, hits: int) -> NS:
    return NS(num_running_reqs=running, num_waiting_reqs=waiting, kv_cache_usage=kv,
              prefix_cache_stats=NS(queries=queries, hits=hits))


def _iter(tokens: int, preempted: int) -> NS:
    return NS(num_generation_tokens=tokens, num_preempted_reqs=preempted)


def _run() -> str:
    return f"v-{uuid.uuid4().hex[:8]}"


def test_engine_rank_from_env_else_data_parallel_index() -> None:
    one = NS(parallel_config=NS(data_parallel_size=1))
    assert rl_vllm.engine_rank(one, 0, {"RLMON_VLLM_ENGINE_RANK": "1",
                                        "RLMON_VLLM_ENGINES": "2"}) == (1, 2)
    assert rl_vllm.engine_rank(NS(parallel_config=NS(data_parallel_size=4)), 3, {}) == (3, 4)
    assert rl_vllm.engine_rank(one, 0, {}) == (0, 1)
    with pytest.raises(ValueError, match="set both"):
        rl_vllm.engine_rank(one, 0, {"RLMON_VLLM_ENGINE_RANK": "1"})
    with pytest.raises(ValueError, match="outside"):
        rl_vllm.engine_rank(one, 0, {"RLMON_VLLM_ENGINE_RANK": "2", "RLMON_VLLM_ENGINES": "2"})


def test_two_separate_engines_with_env_ranks_are_both_counted() -> None:
    """The reviewer's repro: two engines, each a vLLM instance with data_parallel_size=1."""
    hub, t, run = Hub(), [1000.0], _run()
    config = NS(parallel_config=NS(data_parallel_size=1))
    windows = []
    for i in range(2):
        rank, world = rl_vllm.engine_rank(config, 0, {"RLMON_VLLM_ENGINE_RANK": str(i),
                                                      "RLMON_VLLM_ENGINES": "2"})
        rep = hub.reporter(run, "vllm", rank={"dp": rank}, world={"dp": world})
        windows.append(rl_vllm.EngineWindow(rep, 10.0, lambda: t[0]))
    windows[0].record(_sched(4, 1, 0.5, 100, 90), _iter(40, 1))
    windows[1].record(_sched(2, 5, 0.7, 10, 1), _iter(25, 2))
    t[0] = 1010.0
    for w in windows:
        w.tick()
    rec = hub.step("vllm", 0)
    assert rec.complete
    m = rec.metrics
    assert m[catalog.TOKENS] == 65 and m[catalog.NUM_RUNNING_REQS] == 6 and m[catalog.NUM_WAITING_REQS] == 6
    assert m[catalog.PREFIX_CACHE_HIT_RATE] == pytest.approx(91 / 110)
    assert m[catalog.PREEMPTIONS] == 3
    for w in windows:
        w.release()
    hub.close()


def test_two_engines_on_one_rank_fail_loudly_until_released() -> None:
    hub, run = Hub(), _run()
    first = rl_vllm.EngineWindow(hub.reporter(run, "vllm", rank={"dp": 0}, world={"dp": 1}))
    with pytest.raises(rl_vllm.DuplicateEngineRank, match="RLMON_VLLM_ENGINE_RANK"):
        rl_vllm.EngineWindow(hub.reporter(run, "vllm", rank={"dp": 0}, world={"dp": 1}))
    first.release()  # the first engine shut down: its rank is free again
    again = rl_vllm.EngineWindow(hub.reporter(run, "vllm", rank={"dp": 0}, world={"dp": 1}))
    again.release()
    hub.close()


HOLDER = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[2])
    from tests.support.integrations_support import Hub
    from rlmon.actors.integrations.vllm import EngineWindow
    w = EngineWindow(Hub().reporter(sys.argv[1], "vllm", rank={"dp": 0}, world={"dp": 1}))
    print("CLAIMED", flush=True)
    sys.stdin.readline()  # hold the rank until the test says so
""")


def test_an_engine_in_another_process_on_the_same_rank_fails_loudly() -> None:

    run = _run()
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, run, str(REPO)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "CLAIMED"
        hub = Hub()
        with pytest.raises(rl_vllm.DuplicateEngineRank):
            rl_vllm.EngineWindow(hub.reporter(run, "vllm", rank={"dp": 0}, world={"dp": 1}))
        hub.close()
    finally:
        proc.communicate("\n", timeout=30)
