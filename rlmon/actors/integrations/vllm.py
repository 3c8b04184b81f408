"""vLLM: a V1 ``StatLoggerBase`` plugin reporting rollout-engine metrics per engine.

Registered under the entry-point group ``vllm.stat_logger_plugins`` (``pyproject.toml``), so an
``AsyncLLM`` loads it by itself; ``LLMEngine.from_engine_args(..., stat_loggers=[RlmonStatLogger])``
uses it explicitly. Each engine is one rank (``dp`` = engine index) of role ``vllm``; a step is a
wall-clock window of ``RLMON_VLLM_WINDOW_S`` seconds (default 10) aligned to the epoch, so
engines in different processes line up. Per window and engine it sends sufficient statistics, so
the aggregator's sums across engines are right:

- running and waiting requests: the engine's last value, summed over engines;
- KV-cache usage: the last value, averaged over engines (sum, count 1);
- preemptions and generated tokens: summed; tokens per second = tokens / window length, summed;
- prefix-cache hit rate: hits over queries pooled over engines, not a mean of engine rates.

``vllm`` is imported only when ``RlmonStatLogger`` is first touched.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from rlmon.actors.integrations._base import ReporterLike, env_reporter
from rlmon.service import keymaps

__all__ = ["EngineWindow"]  # and RlmonStatLogger, built lazily by __getattr__

ROLE = "vllm"


class EngineWindow:
    """One engine's accumulator over aligned windows; framework-free so it is testable alone."""

    def __init__(self, reporter: ReporterLike, window_s: float = 10.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.reporter, self.window_s, self.clock = reporter, float(window_s), clock
        self.window: int | None = None
        self.running = self.waiting = 0
        self.kv_usage: float | None = None
        self._reset()

    def _reset(self) -> None:
        self.tokens = self.preempted = self.hits = self.queries = 0

    def _advance(self) -> None:
        w = int(self.clock() // self.window_s)
        if self.window is not None and w != self.window:
            self.close_window()
        self.window = w

    def record(self, scheduler_stats: Any, iteration_stats: Any) -> None:
        self._advance()
        if scheduler_stats is not None:
            self.running = int(scheduler_stats.num_running_reqs)
            self.waiting = int(scheduler_stats.num_waiting_reqs)
            self.kv_usage = float(scheduler_stats.kv_cache_usage)
            pcs = getattr(scheduler_stats, "prefix_cache_stats", None)
            if pcs is not None:
                self.hits += int(pcs.hits)
                self.queries += int(pcs.queries)
        if iteration_stats is not None:
            self.tokens += int(iteration_stats.num_generation_tokens)
            self.preempted += int(iteration_stats.num_preempted_reqs)

    def tick(self) -> None:
        """Close the window if the clock has left it (vLLM calls ``log()`` periodically)."""
        if self.window is not None:
            self._advance()

    def close_window(self) -> None:
        if self.window is None:
            return
        rep = self.reporter
        rep.record(keymaps.RUNNING, sum=float(self.running))
        rep.record(keymaps.WAITING, sum=float(self.waiting))
        if self.kv_usage is not None:
            rep.record(keymaps.KV_USAGE, sum=self.kv_usage, count=1.0)
        rep.record(keymaps.PREEMPTIONS, sum=float(self.preempted))
        if self.queries > 0:
            rep.record(keymaps.PREFIX_HIT_RATE, sum=float(self.hits), count=float(self.queries))
        rep.record(keymaps.TOKENS, sum=float(self.tokens))
        rep.record(keymaps.TOKENS_PER_SECOND, sum=self.tokens / self.window_s)
        rep.end_step(self.window)
        self._reset()


def _build() -> type:
    from vllm.v1.metrics.loggers import StatLoggerBase

    class RlmonStatLogger(StatLoggerBase):
        """Per-engine rlmon stat logger (``engine_index`` is the engine's rank)."""

        def __init__(self, vllm_config: Any, engine_index: int = 0, *,
                     reporter: ReporterLike | None = None,
                     clock: Callable[[], float] = time.time) -> None:
            env = os.environ
            engines = int(env.get("RLMON_VLLM_ENGINES", "0")) or int(
                getattr(getattr(vllm_config, "parallel_config", None),
                        "data_parallel_size", 1) or 1)
            rank = int(env.get("RLMON_VLLM_ENGINE_RANK", engine_index))
            self.engine_index = engine_index
            self.reporter = reporter or env_reporter(
                env.get("RLMON_RUN", "vllm"), ROLE, rank={"dp": rank}, world={"dp": engines})
            self.window = EngineWindow(self.reporter,
                                       float(env.get("RLMON_VLLM_WINDOW_S", "10")), clock)

        def record(self, scheduler_stats: Any, iteration_stats: Any,
                   mm_cache_stats: Any = None, engine_idx: int = 0) -> None:
            self.window.record(scheduler_stats, iteration_stats)

        def log(self) -> None:
            self.window.tick()

        def log_engine_initialized(self) -> None:
            pass

        def close(self) -> None:
            """Send the open window and wait for delivery (vLLM has no shutdown hook for this)."""
            self.window.close_window()
            self.window.window = None
            self.reporter.flush(10.0)

    return RlmonStatLogger


_CLASS: type | None = None


def __getattr__(name: str) -> Any:
    global _CLASS
    if name == "RlmonStatLogger":
        if _CLASS is None:
            _CLASS = _build()
        return _CLASS
    raise AttributeError(name)
