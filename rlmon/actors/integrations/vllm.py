"""vLLM: a V1 ``StatLoggerBase`` reporting rollout-engine metrics per engine and per trainer step.

How it gets into an engine:

- ``AsyncLLM``: by itself, through the entry point ``vllm.stat_logger_plugins`` (``pyproject.toml``).
- ``LLM`` (the offline engine RL frameworks use) builds no stat logger of a plugin, so
  ``attach(LLM(..., disable_log_stats=False), run=...)`` adds one to the engine's
  ``StatLoggerManager``; ``attach`` also takes an ``LLMEngine`` or an ``AsyncLLM``.
- ``LLMEngine.from_engine_args(args, stat_loggers=[RlmonStatLogger])`` names it explicitly.

Steps. The rollout loop calls :func:`set_step` with the trainer's global step (or the weights
version it synced); everything the engines of the process generate until the next call is
reported under that step, and each engine sends the step when it changes. Without a ``set_step``
call a step is a window of ``RLMON_VLLM_WINDOW_S`` seconds (default 10) counted from the first
logger of the process (0, 1, 2, ...), for serving; call ``set_step`` before the first request.

Nothing is lost at the end: :func:`close` (or ``RlmonStatLogger.close``), the ``shutdown`` of an
``AsyncLLM`` given to :func:`attach`, the garbage collection of an engine, and the exit of the
process all send the open step and wait for its delivery.

Each engine is one rank ``dp`` of role ``vllm``: ``RLMON_VLLM_ENGINE_RANK`` of
``RLMON_VLLM_ENGINES`` when set (separate ``LLM`` instances, the OpenRLHF / verl rollout layout,
each with ``data_parallel_size=1``), else vLLM's data-parallel engine index of
``data_parallel_size``. Two engines of one run claiming the same rank on one machine raise
:class:`DuplicateEngineRank` instead of having one engine's numbers dropped. Per step and engine
it sends sufficient statistics, so that the aggregator's sums across engines are right:

- generated tokens and preemptions: summed (tokens equal vLLM's ``vllm:generation_tokens``);
- running and waiting requests: the engine's mean over its scheduler iterations in the step,
  summed over engines, and the largest sample of any engine (``..._max``): a gauge's last sample
  reads 0 once a batch is done, its mean over the step shows the load;
- KV-cache usage: the mean over every engine's iterations (sum, count) and the largest sample;
- tokens per second: tokens generated between an engine's first and last iteration of the step
  over that span, summed over engines;
- prefix-cache hit rate: hits over queries pooled over engines, not a mean of engine rates.

``vllm`` is imported only when ``RlmonStatLogger`` or :func:`attach` is first used.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import operator
import os
import tempfile
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from rlmon.actors.integrations._base import ReporterLike, env_reporter, lazy_class
from rlmon.service.metrics import catalog

__all__ = ["DuplicateEngineRank", "EngineWindow", "attach", "close", "current_step",
           "engine_rank", "set_step"]  # and RlmonStatLogger (lazy)

log = logging.getLogger(__name__)

ROLE = "vllm"
ENV_RANK, ENV_WORLD = "RLMON_VLLM_ENGINE_RANK", "RLMON_VLLM_ENGINES"
CLOSE_TIMEOUT_S = 10.0


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


# -- the process's step: set by the rollout loop, read by every engine window ------------------

_LOCK = threading.Lock()
_STATE: dict[str, Any] = {"step": None, "origin": None}
_LIVE: weakref.WeakSet[EngineWindow] = weakref.WeakSet()


def set_step(step: int | None) -> None:
    """Attribute what the engines of this process generate from now on to ``step`` (the trainer's
    global step, or the weights version just synced to the engines).

    Every engine sends the step it was accumulating when the step changes, so a step is final at
    the aggregator as soon as the loop moves on; an engine that generated nothing still sends its
    zeros, so the step of a multi-engine run completes. ``None`` goes back to time windows.
    Steps should increase: numbers sent for a step the aggregator already finalized are counted
    as late, not merged.
    """
    if step is not None:
        value = operator.index(step)
        if isinstance(step, bool) or value < 0:
            raise ValueError(f"step must be an integer >= 0, got {step!r}")
        step = value
    with _LOCK:
        _STATE["step"] = step
        windows = list(_LIVE)
    for window in windows:
        window.advance_to(step)


def current_step() -> int | None:
    """The step :func:`set_step` set last in this process (None: time windows)."""
    return _STATE["step"]


def close(timeout: float = CLOSE_TIMEOUT_S) -> None:
    """Send every engine's open step in this process and wait (``timeout`` in all) for delivery.

    The exit of the process does this by itself; call it where the process lives on after the
    last generation (a notebook, a driver that keeps training without the engines)."""
    _close_windows(list(_LIVE), timeout)


def _close_windows(windows: Iterable[EngineWindow], timeout: float = CLOSE_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    for window in windows:
        window.close(max(0.0, deadline - time.monotonic()))


def _hook_exit() -> None:
    """Send the engines' open steps at interpreter exit, before rlmon's Reporters flush and
    while Ray and vLLM's engines are still up."""
    from rlmon.actors import runtime

    runtime.before_exit_flush(close)


def _process_origin() -> float:
    """The wall time of the first logger of the process: time window 0 starts there, so that the
    data-parallel engines of one ``AsyncLLM`` (one process) share their windows."""
    with _LOCK:
        if _STATE["origin"] is None:
            _STATE["origin"] = time.time()
        return float(_STATE["origin"])


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
    """One engine's accumulator for the current step; framework-free so it is testable alone.

    ``record`` takes vLLM's ``SchedulerStats`` and ``IterationStats`` (or anything with their
    fields) from the engine's thread, :func:`set_step` and ``close`` come from others: a lock
    keeps each step's numbers whole. ``origin`` is where time window 0 starts (default: now).
    """

    def __init__(self, reporter: ReporterLike, window_s: float = 10.0,
                 clock: Callable[[], float] = time.time, *, origin: float | None = None) -> None:
        if not window_s > 0:
            raise ValueError(f"window_s must be > 0, got {window_s!r}")
        self.reporter, self.window_s, self.clock = reporter, float(window_s), clock
        self.origin = float(clock() if origin is None else origin)
        rank = getattr(reporter, "rank", None)
        as_dict = getattr(rank, "as_dict", None)
        self._claim = _RankClaim(str(getattr(reporter, "run", "")), ROLE,
                                 as_dict() if callable(as_dict) else {}) \
            if hasattr(reporter, "run") else None
        self._lock = threading.Lock()
        self.steps_sent: deque[int] = deque(maxlen=256)  # the latest steps sent (bounded)
        self._reset()
        with _LOCK:
            self.step: int | None = _STATE["step"]  # the step being accumulated, if any
            _LIVE.add(self)
        _hook_exit()

    def _reset(self) -> None:
        self.tokens = self.preempted = self.hits = self.queries = 0
        self.samples = self.running_max = self.waiting_max = 0
        self.running_sum = self.waiting_sum = 0
        self.kv_sum = self.kv_max = 0.0
        self.first_t: float | None = None
        self.first_tokens = 0
        self.last_t = 0.0

    def _step_now(self, now: float) -> int:
        explicit = _STATE["step"]
        if explicit is not None:
            return int(explicit)
        if not _STATE.get("said_windows"):  # once per process
            _STATE["said_windows"] = True
            log.warning("rlmon: vLLM reports each %g-second window of its statistics as a step "
                        "(0, 1, 2, ...): no set_step call; call rlmon.actors.integrations.vllm."
                        "set_step(trainer_step) in the rollout loop to report under the "
                        "trainer's steps (docs/integrations.md)", self.window_s)
        return max(0, int((now - self.origin) // self.window_s))

    def record(self, scheduler_stats: Any, iteration_stats: Any) -> None:
        now = self.clock()
        with self._lock:
            step = self._step_now(now)
            if self.step is not None and step != self.step:
                self._send()
            self.step = step
            if scheduler_stats is not None:
                running = int(scheduler_stats.num_running_reqs)
                waiting = int(scheduler_stats.num_waiting_reqs)
                kv = float(scheduler_stats.kv_cache_usage)
                self.samples += 1
                self.running_sum += running
                self.waiting_sum += waiting
                self.kv_sum += kv
                self.running_max = max(self.running_max, running)
                self.waiting_max = max(self.waiting_max, waiting)
                self.kv_max = max(self.kv_max, kv)
                pcs = getattr(scheduler_stats, "prefix_cache_stats", None)
                if pcs is not None:
                    self.hits += int(pcs.hits)
                    self.queries += int(pcs.queries)
            if iteration_stats is not None:
                tokens = int(iteration_stats.num_generation_tokens)
                self.tokens += tokens
                self.preempted += int(iteration_stats.num_preempted_reqs)
                if tokens:
                    if self.first_t is None:
                        self.first_t, self.first_tokens = now, tokens
                    self.last_t = now

    def tick(self) -> None:
        """Send the time window the clock has left (vLLM calls ``log()`` every few seconds)."""
        now = self.clock()
        with self._lock:
            if self.step is not None and self._step_now(now) != self.step:
                self._send()
                self.step = None

    def advance_to(self, step: int | None) -> None:
        """:func:`set_step` moved on: send the step accumulated so far, start ``step``."""
        with self._lock:
            if self.step is not None and self.step != step:
                self._send()
            self.step = step

    def close_window(self) -> None:
        """Send the open step now (the next record starts the current one again)."""
        with self._lock:
            if self.step is not None:
                self._send()
            self.step = None

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> bool:
        """Send the open step and wait up to ``timeout`` s for delivery; False if it timed out."""
        self.close_window()
        return bool(self.reporter.flush(timeout))

    def _send(self) -> None:
        assert self.step is not None
        rep, n = self.reporter, self.samples
        rep.record(catalog.TOKENS, sum=float(self.tokens))
        rep.record(catalog.PREEMPTIONS, sum=float(self.preempted))
        rep.record(catalog.NUM_RUNNING_REQS, sum=self.running_sum / n if n else 0.0)
        rep.record(catalog.NUM_RUNNING_REQS_MAX, max=float(self.running_max))
        rep.record(catalog.NUM_WAITING_REQS, sum=self.waiting_sum / n if n else 0.0)
        rep.record(catalog.NUM_WAITING_REQS_MAX, max=float(self.waiting_max))
        if n:
            rep.record(catalog.KV_CACHE_USAGE, sum=self.kv_sum, count=float(n))
            rep.record(catalog.KV_CACHE_USAGE_MAX, max=self.kv_max)
        if self.queries > 0:
            rep.record(catalog.PREFIX_CACHE_HIT_RATE, sum=float(self.hits), count=float(self.queries))
        if self.first_t is not None and self.last_t > self.first_t:
            rate = (self.tokens - self.first_tokens) / (self.last_t - self.first_t)
            rep.record(catalog.TOKENS_PER_SECOND, sum=rate)
        rep.end_step(self.step)
        self.steps_sent.append(self.step)
        self._reset()

    def release(self) -> None:
        """Give up this engine's rank (the engine shut down)."""
        if self._claim is not None:
            self._claim.release()


def _build() -> type:
    from vllm.v1.metrics.loggers import StatLoggerBase

    class RlmonStatLogger(StatLoggerBase):
        """Per-engine rlmon stat logger (``engine_index`` is the engine's rank).

        ``run`` defaults to ``RLMON_RUN`` (else ``vllm``); ``reporter`` to a Reporter built by
        ``make`` (``RLMON_SINK_JSONL`` picks a file, else the Ray aggregator of
        ``RLMON_NAMESPACE``)."""

        set_step = staticmethod(set_step)

        def __init__(self, vllm_config: Any, engine_index: int = 0, *,
                     run: str | None = None, reporter: ReporterLike | None = None,
                     make: Callable[..., ReporterLike] = env_reporter,
                     clock: Callable[[], float] = time.time) -> None:
            env = os.environ
            rank, engines = engine_rank(vllm_config, engine_index)
            self.engine_index, self.rank, self.engines = engine_index, rank, engines
            self._own = reporter is None  # made here: closed with the engine
            self.reporter = reporter or make(
                run or env.get("RLMON_RUN", "vllm"), ROLE, rank={"dp": rank},
                world={"dp": engines})
            origin = _process_origin() if clock is time.time else None
            self.window = EngineWindow(self.reporter,
                                       float(env.get("RLMON_VLLM_WINDOW_S", "10")), clock,
                                       origin=origin)
            # The engine was dropped (an AsyncLLM after shutdown, an LLM going out of scope):
            # send its open step. At exit the thread-exit hook has done it, while Ray is up.
            weakref.finalize(self, _close_windows, [self.window]).atexit = False

        def record(self, scheduler_stats: Any, iteration_stats: Any,
                   mm_cache_stats: Any = None, engine_idx: int = 0) -> None:
            self.window.record(scheduler_stats, iteration_stats)

        def log(self) -> None:
            self.window.tick()

        def log_engine_initialized(self) -> None:
            pass

        def close(self, timeout: float = CLOSE_TIMEOUT_S) -> bool:
            """Send the open step, wait for delivery, give up the engine's rank; the engine's
            end (its shutdown, its collection) closes the Reporter made for it, so the rank
            ends cleanly instead of going silent."""
            done = self.window.close(timeout)
            self.window.release()
            if self._own:
                self.reporter.close()
            return done

    return RlmonStatLogger


__getattr__ = lazy_class(__name__, "RlmonStatLogger", _build)


def _ours(manager: Any) -> list[Any]:
    """The rlmon loggers already in a ``StatLoggerManager`` (plugin or ``stat_loggers=``)."""
    cls = __getattr__("RlmonStatLogger")
    found = []
    for agg in getattr(manager, "stat_loggers", ()):
        per_engine = getattr(agg, "per_engine_stat_loggers", None) or {}
        found += [lg for lg in per_engine.values() if isinstance(lg, cls)]
    return found


def _close_loggers(loggers: list[Any], timeout: float = CLOSE_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    for lg in loggers:
        lg.close(max(0.0, deadline - time.monotonic()))


def attach(engine: Any, *, run: str | None = None, reporter: ReporterLike | None = None,
           make: Callable[..., ReporterLike] = env_reporter) -> list[Any]:
    """Report an engine to rlmon; returns its rlmon loggers (one per data-parallel engine).

    ``engine`` is a ``vllm.LLM`` built with ``disable_log_stats=False`` (the default of ``LLM``
    turns vLLM's statistics off at the source: no logger can see them), an ``LLMEngine`` or an
    ``AsyncLLM``. An engine that already has rlmon loggers (an ``AsyncLLM`` loads them by itself)
    keeps them. The open step is sent when the engine is garbage-collected, when an ``AsyncLLM``
    shuts down, and at the exit of the process.
    """
    target = getattr(engine, "llm_engine", engine)  # LLM -> its LLMEngine
    manager = getattr(target, "logger_manager", None)
    if manager is None:
        raise ValueError(
            "this vLLM engine collects no statistics: build it with disable_log_stats=False, "
            "e.g. LLM(model, disable_log_stats=False) (LLM turns them off by default)")
    loggers = _ours(manager)
    if loggers and reporter is not None:
        raise ValueError("the engine already reports to rlmon (the vllm.stat_logger_plugins "
                         "entry point); set RLMON_RUN / RLMON_NAMESPACE instead of reporter=")
    if not loggers:
        from vllm.v1.metrics.loggers import PerEngineStatLoggerAdapter

        indexes = list(getattr(manager, "engine_indexes", None) or [0])
        if reporter is not None and len(indexes) > 1:
            raise ValueError(f"{len(indexes)} data-parallel engines need a reporter each: "
                             "pass make= instead of reporter=")
        cls = __getattr__("RlmonStatLogger")

        def factory(vllm_config: Any, engine_index: int = 0) -> Any:
            return cls(vllm_config, engine_index, run=run, reporter=reporter, make=make)

        adapter = PerEngineStatLoggerAdapter(target.vllm_config, indexes, factory)
        adapter.log_engine_initialized()
        manager.stat_loggers.insert(0, adapter)
        loggers = list(adapter.per_engine_stat_loggers.values())
    finalizer = weakref.finalize(engine, _close_loggers, list(loggers))
    finalizer.atexit = False  # the thread-exit hook sends earlier, while Ray is still up
    shutdown = getattr(type(engine), "shutdown", None)
    if callable(shutdown) and "shutdown" not in vars(engine):
        ref = weakref.ref(engine)  # no cycle: AsyncLLM relies on __del__ to shut down

        def shutdown_then_close(*args: Any, **kwargs: Any) -> Any:
            _close_loggers(loggers)
            eng = ref()
            if eng is None:
                return None
            vars(eng).pop("shutdown", None)  # once: a later shutdown (__del__) is vLLM's own
            return shutdown(eng, *args, **kwargs)

        engine.shutdown = shutdown_then_close
    return loggers
