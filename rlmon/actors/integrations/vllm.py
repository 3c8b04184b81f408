"""vLLM: a V1 ``StatLoggerBase`` plugin reporting rollout-engine metrics per engine.

Registered under the entry-point group ``vllm.stat_logger_plugins`` (``pyproject.toml``), so an
``AsyncLLM`` loads it by itself; ``LLMEngine.from_engine_args(..., stat_loggers=[RlmonStatLogger])``
uses it explicitly. Each engine is one rank ``dp`` of role ``vllm``: ``RLMON_VLLM_ENGINE_RANK`` of
``RLMON_VLLM_ENGINES`` when set (separate ``LLM`` instances, the OpenRLHF / verl rollout layout,
each with ``data_parallel_size=1``), else vLLM's data-parallel engine index of
``data_parallel_size``. Two engines of one run claiming the same rank on one machine raise
:class:`DuplicateEngineRank` instead of having one engine's numbers dropped. A step is a
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

import fcntl
import hashlib
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any

from rlmon.actors.integrations._base import ReporterLike, env_reporter, lazy_class
from rlmon.service import keymaps

__all__ = ["DuplicateEngineRank", "EngineWindow", "engine_rank"]  # and RlmonStatLogger (lazy)

ROLE = "vllm"
ENV_RANK, ENV_WORLD = "RLMON_VLLM_ENGINE_RANK", "RLMON_VLLM_ENGINES"


class DuplicateEngineRank(RuntimeError):
    """Two engines of one run report as the same rank: the aggregator would keep only one."""


def engine_rank(vllm_config: Any, engine_index: int = 0,
                env: Mapping[str, str] | None = None) -> tuple[int, int]:
    """(rank, world) of one engine: the ``RLMON_VLLM_ENGINE_RANK`` / ``RLMON_VLLM_ENGINES`` pair
    when set, else vLLM's data-parallel engine index and ``data_parallel_size``."""
    env = os.environ if env is None else env
    rank_s, world_s = env.get(ENV_RANK), env.get(ENV_WORLD)
    if (rank_s is None) != (world_s is None):
        raise ValueError(f"set both {ENV_RANK} (this engine, 0..N-1) and {ENV_WORLD} (N)")
    if rank_s is not None and world_s is not None:
        rank, world = int(rank_s), int(world_s)
    else:
        pc = getattr(vllm_config, "parallel_config", None)
        world = int(getattr(pc, "data_parallel_size", 1) or 1)
        rank = int(engine_index) if world > 1 else 0
    if not 0 <= rank < world:
        raise ValueError(f"vLLM engine rank {rank} outside 0..{world - 1}")
    return rank, world


class _RankClaim:
    """An exclusive lock file per (run, role, rank) held while an engine reports: a second engine
    claiming it in any process of this machine fails loudly (flock, released when the holder
    exits)."""

    def __init__(self, run: str, role: str, rank: Mapping[str, int]) -> None:
        label = f"{run}/{role}/" + ",".join(f"{k}={v}" for k, v in sorted(rank.items()))
        folder = os.path.join(tempfile.gettempdir(), "rlmon-vllm-ranks")
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, hashlib.sha256(label.encode()).hexdigest()[:24] + ".lock")
        self._fh: Any = open(path, "a+")  # noqa: SIM115  (held for the engine's lifetime)
        try:
            fcntl.flock(self._fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._fh.close()
            self._fh = None
            raise DuplicateEngineRank(
                f"another vLLM engine of run {run!r} already reports as {label.split('/')[-1]}: "
                f"its numbers would be dropped as duplicates. Give each engine a distinct "
                f"{ENV_RANK}=0..N-1 with {ENV_WORLD}=N (or use vLLM data parallelism)") from None

    def release(self) -> None:
        if self._fh is not None:
            fcntl.flock(self._fh, fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None


class EngineWindow:
    """One engine's accumulator over aligned windows; framework-free so it is testable alone."""

    def __init__(self, reporter: ReporterLike, window_s: float = 10.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.reporter, self.window_s, self.clock = reporter, float(window_s), clock
        rank = getattr(reporter, "rank", None)
        as_dict = getattr(rank, "as_dict", None)
        self._claim = _RankClaim(str(getattr(reporter, "run", "")), ROLE,
                                 as_dict() if callable(as_dict) else {}) \
            if hasattr(reporter, "run") else None
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

    def release(self) -> None:
        """Give up this engine's rank (the engine shut down)."""
        if self._claim is not None:
            self._claim.release()


def _build() -> type:
    from vllm.v1.metrics.loggers import StatLoggerBase

    class RlmonStatLogger(StatLoggerBase):
        """Per-engine rlmon stat logger (``engine_index`` is the engine's rank)."""

        def __init__(self, vllm_config: Any, engine_index: int = 0, *,
                     reporter: ReporterLike | None = None,
                     make: Callable[..., ReporterLike] = env_reporter,
                     clock: Callable[[], float] = time.time) -> None:
            env = os.environ
            rank, engines = engine_rank(vllm_config, engine_index)
            self.engine_index, self.rank, self.engines = engine_index, rank, engines
            self.reporter = reporter or make(
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
            self.window.release()

    return RlmonStatLogger


__getattr__ = lazy_class(__name__, "RlmonStatLogger", _build)
