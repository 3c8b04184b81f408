"""The service's live goodput: finalized steps of every role joined per (run, attempt, step),
accounted once the run has moved past them, added to per-run counters for the exporter.

A step's roles finalize separately (the rollout engine's step, the reward worker's, the
trainer's), and why a rank waited is read from the other roles' timelines of the same step and of
its neighbours; the tied-groups fraction often arrives with another role than the generation
it splits. So a step waits in :class:`GoodputLedger` until the run is ``hold_steps`` steps past
it (or finishes), then :func:`~rlmon.service.goodput.accounting.account_step` runs on what
arrived. Memory is bounded by the held steps of the runs in memory.

GPUs per rank come from the config's entry for the role (``goodput.gpus_per_rank``), else what
the role's Reporters declare (``Reporter(gpus_per_rank=...)``, riding on their heartbeats), else
the config's ``*``, else 1;
:meth:`GoodputLedger.run_gpus` is what every alert's cost multiplies by
(:mod:`rlmon.service.goodput.cost`).

A rollback (a later attempt of the run re-runs a step: its first step of the attempt is at or
before the step) makes the earlier attempt's work of those steps wasted ``rolled_back``, as the
offline report counts it. A step still held when the rollback is known is accounted so; one
already added to the counters cannot be taken out of them (Prometheus counters only grow), so
its productive and overhead GPU-seconds are added to :attr:`RunGoodput.rolled_back` instead,
by (role, bucket they were counted in), and the goodput ratio subtracts them. The last
``_MAX_ROLLBACK`` accounted steps of each run are remembered for this; a rollback further back
corrects only those.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from rlmon.service.config import GoodputConfig
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.goodput.accounting import (
    Classified,
    Key,
    RoleTimelines,
    StepGoodput,
    StepInput,
    account_step,
    mfu,
)
from rlmon.service.goodput.buckets import Bucket, SpanMap
from rlmon.service.goodput.cost import Price
from rlmon.service.metrics import catalog

__all__ = ["GoodputLedger", "RunGoodput", "discard_reason", "gpus_per_rank", "span_map"]

log = logging.getLogger("rlmon.goodput")
_MAX_HELD = 64  # steps held per run; beyond, the oldest is accounted with what it has
_MAX_ROLLBACK = 1_024  # accounted steps per run whose work a later rollback can still correct
_REDOABLE = (Bucket.PRODUCTIVE, Bucket.OVERHEAD)  # what a rollback turns into wasted


def span_map(config: GoodputConfig) -> SpanMap:
    return SpanMap(config.spans, Bucket(config.unmapped_bucket))


def gpus_per_rank(config: GoodputConfig, role: str) -> float:
    table = config.gpus_per_rank
    return float(table.get(role, table.get("*", 1.0)))


def discard_reason(metrics: Mapping[str, float], skipped_before: float | None) -> str:
    """Why a step's work was thrown away: DeepSpeed skipped its optimizer step (the running
    count ``actor/skipped_steps`` went up); '' otherwise."""
    skipped = metrics.get(catalog.SKIPPED_STEPS)
    if (skipped is not None and skipped_before is not None and math.isfinite(skipped)
            and skipped > skipped_before):
        return "the optimizer step was skipped (actor/skipped_steps rose)"
    return ""


@dataclass(slots=True)
class _Held:
    roles: dict[str, RoleTimelines] = field(default_factory=dict)
    zero_std: float | None = None
    clipped: float | None = None
    discarded: str = ""
    tokens: float = 0.0


@dataclass(slots=True)
class RunGoodput:
    """A run's counters: GPU-seconds by (role, bucket, reason), steps accounted, tokens (MFU)."""

    seconds: dict[Key, float] = field(default_factory=dict)
    steps: int = 0
    tokens: float = 0.0
    # (role, bucket) -> GPU-seconds counted in ``seconds`` under that productive or overhead
    # bucket before a rollback made them wasted (``rolled_back``)
    rolled_back: dict[tuple[str, Bucket], float] = field(default_factory=dict)

    def total(self, bucket: Bucket | None = None) -> float:
        return sum(v for (_, b, _), v in self.seconds.items() if bucket is None or b is bucket)

    @property
    def goodput(self) -> float:
        """Productive over all GPU-seconds, the work a rollback undid not productive."""
        total = self.total()
        undone = sum(v for (_, b), v in self.rolled_back.items() if b is Bucket.PRODUCTIVE)
        return (self.total(Bucket.PRODUCTIVE) - undone) / total if total > 0 else math.nan


class GoodputLedger:
    """Live goodput per run (thread-safe; the exporter reads :meth:`snapshot`)."""

    def __init__(self, config: GoodputConfig | None = None) -> None:
        self.config = config or GoodputConfig()
        self.spans = span_map(self.config)
        self.price = Price(self.config.price_per_gpu_hour, self.config.currency)
        self._lock = threading.Lock()  # the ledger's state
        self._work = threading.Lock()  # one accounting at a time (and the split cache)
        self._wanted = threading.Event()
        self._closing = False
        self._thread: threading.Thread | None = None
        self.errors = 0  # accountings that raised (logged; the steps they held are lost)
        self._held: dict[str, dict[tuple[int, int], _Held]] = {}
        self._last: dict[str, tuple[int, int]] = {}  # newest (attempt, step) seen per run
        self._done: dict[str, dict[tuple[int, int], tuple[RoleTimelines, ...]]] = {}
        self._skipped: dict[tuple[str, str], float] = {}
        self._ranks: dict[tuple[str, str], int] = {}  # (run, role) -> expected ranks
        self._declared: dict[tuple[str, str], float] = {}  # (run, role) -> the Reporters' say
        self.runs: dict[str, RunGoodput] = {}
        self._restarts: dict[str, dict[int, int]] = {}  # run -> attempt -> its first step
        # run -> (attempt, step) -> its productive and overhead GPU-seconds by (role, bucket)
        self._redoable: dict[str, dict[tuple[int, int], dict[tuple[str, Bucket], float]]] = {}
        self._classified: Classified = {}  # the held and done steps' timelines, split

    def declare(self, run: str, role: str, per_rank: float | None,
                ranks: int | None = None) -> None:
        """What the role's Reporters say each rank holds (the config's entry for the role
        wins; None: they said nothing) and, from the liveness views, how many ranks the role
        has when no step told it yet (a run stuck in its first step still costs its GPUs)."""
        with self._lock:
            if per_rank is not None:
                self._declared[(run, role)] = per_rank
            if ranks is not None and (run, role) not in self._ranks:
                self._ranks[(run, role)] = ranks

    def _per_rank(self, run: str, role: str) -> float:
        table = self.config.gpus_per_rank
        if role in table:
            return float(table[role])
        declared = self._declared.get((run, role))
        return declared if declared is not None else float(table.get("*", 1.0))

    def add(self, record: StepRecord) -> None:
        """Hold ``record``'s step (cheap: the alert path calls it; :meth:`account` does the
        work after the step's alerts are out)."""
        run, role = record.run, record.role
        key = (record.attempt, record.step)
        with self._lock:
            self._ranks[(run, role)] = record.ranks_expected
            held = self._held.setdefault(run, {}).setdefault(key, _Held())
            metrics = record.metrics
            if catalog.FRAC_REWARD_ZERO_STD in metrics:
                held.zero_std = metrics[catalog.FRAC_REWARD_ZERO_STD]
            if catalog.CLIPPED_RATIO in metrics:
                held.clipped = metrics[catalog.CLIPPED_RATIO]
            tokens = metrics.get(catalog.TOKENS)
            if tokens is not None and math.isfinite(tokens):
                held.tokens += tokens
            why = discard_reason(metrics, self._skipped.get((run, role)))
            held.discarded = held.discarded or why
            skipped = metrics.get(catalog.SKIPPED_STEPS)
            if skipped is not None and math.isfinite(skipped):
                self._skipped[(run, role)] = skipped
            if record.timelines:
                held.roles[role] = RoleTimelines(role, record.timelines,
                                                 self._per_rank(run, role))
            last = self._last.get(run)
            if last is None or key > last:
                self._last[run] = key
            if record.attempt > 0:
                starts = self._restarts.setdefault(run, {})
                first = starts.get(record.attempt)
                if first is None or record.step < first:
                    starts[record.attempt] = record.step
                    self._roll_back(run)

    def _rerun_from(self, run: str, attempt: int) -> float:
        """The first step a later attempt than ``attempt`` re-ran (inf: none)."""
        starts = self._restarts.get(run, {})
        return min((s for a, s in starts.items() if a > attempt), default=math.inf)

    def _roll_back(self, run: str) -> None:
        """Steps already accounted that a later attempt re-ran: their productive and overhead
        GPU-seconds move to the run's ``rolled_back`` counter (once each)."""
        done = self._redoable.get(run)
        if not done or run not in self._restarts:  # no later attempt: nothing was re-run
            return
        totals = self.runs.setdefault(run, RunGoodput())
        for key in [k for k in done if k[1] >= self._rerun_from(run, k[0])]:
            for part, value in done.pop(key).items():
                totals.rolled_back[part] = totals.rolled_back.get(part, 0.0) + value

    def start(self) -> None:
        """Account on a thread of the ledger's own from now on (the service's ``start``)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="rlmon-goodput",
                                            daemon=True)
            self._thread.start()

    def wake(self) -> None:
        """Have the ledger's own thread account what is ready (the service calls this after a
        batch's alerts are out, so the accounting delays neither them nor the next batch);
        not started, the ledger accounts here, on the caller's thread."""
        if self._thread is None:
            self._account_logged()
            return
        self._wanted.set()

    def _loop(self) -> None:
        while True:
            self._wanted.wait()
            self._wanted.clear()
            if self._closing:
                return
            self._account_logged()

    def _account_logged(self) -> None:
        try:
            self.account()
        except Exception:  # a bug must not stop the accounting of the next steps
            self.errors += 1
            log.exception("rlmon: goodput accounting failed (counted in errors)")

    def close(self, timeout: float = 5.0) -> None:
        self._closing = True
        self._wanted.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def finish(self, run: str) -> list[StepGoodput]:
        """The run ended: account every step it still holds."""
        return self.account(final=run)

    def account(self, final: str | None = None) -> list[StepGoodput]:
        """Account the held steps the runs are far enough past (every step of run ``final``);
        one caller at a time, the exporter's reads never wait for the accounting itself."""
        with self._work:
            with self._lock:
                jobs = [job for run in list(self._held)
                        for job in self._ready(run, run == final)]
            results = [(run, held, account_step(data, self.spans, self._classified))
                       for run, held, data in jobs]
            with self._lock:
                for run, held, result in results:
                    if run not in self._last:
                        continue  # forgotten while it was accounted: bring nothing of it back
                    totals = self.runs.setdefault(run, RunGoodput())
                    for k, v in result.seconds.items():
                        totals.seconds[k] = totals.seconds.get(k, 0.0) + v
                    totals.steps += 1
                    totals.tokens += held.tokens
                    redoable = self._redoable.setdefault(run, {})
                    parts = redoable[(result.attempt, result.step)] = {}
                    for (role, bucket, _), v in result.seconds.items():
                        if bucket in _REDOABLE:
                            parts[(role, bucket)] = parts.get((role, bucket), 0.0) + v
                    while len(redoable) > _MAX_ROLLBACK:
                        del redoable[min(redoable)]
                    self._roll_back(run)  # a rollback known while this step was accounted
                if results:
                    self._keep_classified()
            return [result for _, _, result in results]

    def forget(self, runs: Iterable[str]) -> None:
        """Runs that left memory: drop their held steps and counters."""
        with self._lock:
            for run in runs:
                self._held.pop(run, None)
                self._last.pop(run, None)
                self._done.pop(run, None)
                self.runs.pop(run, None)
                self._restarts.pop(run, None)
                self._redoable.pop(run, None)
                for key in [k for k in self._ranks if k[0] == run]:
                    self._ranks.pop(key, None)
                    self._skipped.pop(key, None)
                for key in [k for k in self._declared if k[0] == run]:
                    del self._declared[key]

    def _ready(self, run: str, final: bool) -> list[tuple[str, _Held, StepInput]]:
        """Take the run's steps that are ready, with what their accounting needs."""
        held = self._held.get(run, {})
        last = self._last.get(run, (0, 0))
        ready = sorted(k for k in held if final or k[0] < last[0]
                       or k[1] + self.config.hold_steps <= last[1])
        while len(held) - len(ready) > _MAX_HELD:
            ready.append(min(k for k in held if k not in ready))
        out = []
        done = self._done.setdefault(run, {})
        for key in sorted(ready):
            step = held.pop(key)
            if not step.roles:
                continue
            attempt, n = key
            neighbours = [*done.get((attempt, n - 1), ()),
                          *(held[(attempt, n + 1)].roles.values()
                            if (attempt, n + 1) in held else ())]
            out.append((run, step, StepInput(
                run, attempt, n, tuple(step.roles.values()), step.zero_std, step.clipped,
                step.discarded, tuple(neighbours),
                rolled_back=n >= self._rerun_from(run, attempt))))
            done[key] = tuple(step.roles.values())
            while len(done) > 2:
                del done[min(done)]
        if not held:
            self._held.pop(run, None)
        return out

    def _keep_classified(self) -> None:
        """Forget the splits of timelines no held or done step holds any more."""
        alive = {id(t.timeline) for steps in self._held.values() for h in steps.values()
                 for rt in h.roles.values() for t in rt.timelines}
        alive |= {id(t.timeline) for steps in self._done.values() for roles in steps.values()
                  for rt in roles for t in rt.timelines}
        for key in [k for k in self._classified if k not in alive]:
            del self._classified[key]

    def run_gpus(self, run: str) -> float:
        """The run's GPUs: every role's expected ranks times its GPUs per rank."""
        with self._lock:
            return sum(n * self._per_rank(r, role) for (r, role), n in self._ranks.items()
                       if r == run)

    def mfu(self, run: str) -> float | None:
        """The run's MFU so far, when the config gives the FLOPs per token and the peak."""
        cfg = self.config
        totals = self.runs.get(run)
        if totals is None or cfg.model_flops_per_token is None or cfg.peak_flops_per_gpu is None:
            return None
        return mfu(totals.tokens, cfg.model_flops_per_token, totals.total(),
                   cfg.peak_flops_per_gpu)

    def rolled_back(self) -> dict[str, dict[tuple[str, Bucket], float]]:
        """run -> (role, bucket) -> GPU-seconds counted productive or overhead before a
        rollback made them wasted (the exporter's ``rlmon_goodput_rolled_back_gpu_seconds``)."""
        with self._lock:
            return {run: dict(t.rolled_back) for run, t in self.runs.items() if t.rolled_back}

    def snapshot(self) -> dict[str, tuple[dict[Key, float], float, float | None]]:
        """run -> (GPU-seconds by (role, bucket, reason), goodput, MFU or None)."""
        with self._lock:
            return {run: (dict(t.seconds), t.goodput, self.mfu(run))
                    for run, t in self.runs.items()}
