"""The JSON API under ``/api/`` that the run page uses and scripts can use (docs/page.md).

Every answer is read from the history store through the reader's own connection (read-only when
the store is a file), so a slow request never holds the lock the alert path writes under.

- ``GET /api/runs``: every run (its state, start, duration, GPUs, cost, settings, tags, firing
  alerts) with its roles beneath (each role's state, last step, ranks reporting, alerts)
- ``GET /api/curves?run=R&role=A[&from=S&to=S&points=N]``: the key curves, downsampled, with the
  alert transitions in the range, each point's time and each metric's spread across ranks (the
  lowest and highest rank's own value, where two ranks or more reported it)
- ``GET /api/curves?...&metrics=M1%0AM2``: those metrics instead, one panel each (any metric
  the stream reported: the key curves from their packed rows, others from the step lines)
- ``GET /api/metrics?run=R&role=A[&attempt=N]``: every metric the stream reported, its attempts
- ``GET /api/diff?a=R&b=R``: where two stored runs part ways (``rlmon diff A B --json``),
  read within a budget, cached, a limited number at a time (:mod:`.diff_reads`)
- ``GET /api/alerts[?run=R&firing=1&limit=N]``: what ``rlmon alerts --json`` prints
- ``GET /api/alert?run=R&role=A&alert=NAME[&step=S]``: one alert: its condition, the values
  around its onset, what to check, its worst samples and the onset step's timeline per rank
- ``GET /api/trace?run=R&from=S&to=S[&role=A]``: the Perfetto trace of those steps (a download;
  at most 1,000 steps)
"""

from __future__ import annotations

import json
import math
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlmon.service.alerting import first_mover
from rlmon.service.alerting.conditions.kind import Condition
from rlmon.service.alerting.rules import Rule
from rlmon.service.alerting.what_to_check import what_to_check
from rlmon.service.contract.run_info import MAX_TAGS
from rlmon.service.goodput.cost import Price
from rlmon.service.liveness.run_level import UNKNOWN, run_state
from rlmon.service.liveness.run_state import RunState
from rlmon.service.metrics import catalog, remedies
from rlmon.service.storage import curve_rows
from rlmon.service.storage.extremes_rows import Extremes
from rlmon.service.storage.history import HistoryStore
from rlmon.service.storage.stored_samples import items_to_json
from rlmon.service.web.curves import ColumnCache, Columns, downsample
from rlmon.service.web.diff_reads import DiffError, DiffReads

__all__ = ["PANELS", "ApiError", "Panel", "WebApi", "alerts_json"]

StreamStates = Callable[[], Mapping[tuple[str, str], str]]
Goodput = Callable[[], Mapping[str, float]]
RunInfos = Callable[[], Mapping[str, Mapping[str, str]]]  # run -> the settings it reported
# the states in which a run still holds its GPUs: its duration (and cost) runs until now
_HOLDING = frozenset({RunState.RUNNING, RunState.SLOW, RunState.STALLED, RunState.FROZEN})


@dataclass(frozen=True, slots=True)
class Panel:
    """One chart of the run page: a title and the catalog metrics drawn in it."""

    title: str
    metrics: tuple[str, ...]


PANELS: tuple[Panel, ...] = (
    Panel("IS ratio and its extremes",
          (catalog.IS_RATIO, catalog.IS_RATIO_MIN, catalog.IS_RATIO_MAX)),
    Panel("log-prob mismatch", (catalog.LOGP_DIFF, catalog.LOGP_DIFF_MAX)),
    Panel("KL to the reference", (catalog.KL,)),
    Panel("entropy", (catalog.ENTROPY,)),
    Panel("clip ratio", (catalog.CLIP_RATIO,)),
    Panel("reward", (catalog.REWARD,)),
    Panel("grad norm", (catalog.GRAD_NORM,)),
    Panel("response length", (catalog.RESPONSE_LENGTH,)),
    Panel("policy lag", (catalog.POLICY_LAG,)),
    Panel("step time", (catalog.STEP_SECONDS,)),
)
_KEY_METRICS = tuple(m for p in PANELS for m in p.metrics)
_MAX_OTHER = 12  # a role without any key metric shows up to this many of its own
_AROUND = 20  # steps either side of an alert's onset
_MAX_PICKED = 24  # metrics picked by name in one request
_TIMED_STREAMS = 8  # streams whose points' times are kept (a dict of the points drawn each)
_TIMES_KEPT = 50_000  # points' times kept per stream
_TRACE_STEPS = 1_000  # steps one /api/trace covers, at most
_NAMES_STEPS = 500  # steps a query of the metrics' names reads (a wait of tens of ms for others)
# every metric and non-finite value's name in a stream's steps (after, last]: bound parameters
_METRIC_NAMES = (
    "SELECT j.key FROM steps s, json_each(s.line, '$.metrics') j WHERE s.run = ?1 AND "
    "s.role = ?2 AND s.attempt = ?3 AND s.step > ?4 AND s.step <= ?5 UNION "
    "SELECT j.key FROM steps s, json_each(s.line, '$.nonfinite') j WHERE s.run = ?1 AND "
    "s.role = ?2 AND s.attempt = ?3 AND s.step > ?4 AND s.step <= ?5")


class ApiError(Exception):
    """A request the API refuses: ``status`` and a message naming the parameter."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _number(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def _int_param(params: Mapping[str, str], name: str, default: int | None = None,
               low: int = 0, high: int = 2**62) -> int | None:
    text = params.get(name)
    if text is None or text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        raise ApiError(400, f"{name}: not an integer: {text!r}") from None
    if not low <= value <= high:
        raise ApiError(400, f"{name}: {value} is outside [{low}, {high}]")
    return value


def _picked(params: Mapping[str, str]) -> tuple[str, ...]:
    """The metrics asked for by name (``metrics``: names separated by newlines)."""
    names = tuple(dict.fromkeys(n for n in params.get("metrics", "").split("\n") if n))
    if len(names) > _MAX_PICKED:
        raise ApiError(400, f"metrics: {len(names)} names, at most {_MAX_PICKED}")
    return names


def _required(params: Mapping[str, str], name: str) -> str:
    value = params.get(name)
    if not value:
        raise ApiError(400, f"missing parameter {name!r}")
    return value


def alerts_json(store: HistoryStore, run: str | None = None, firing_only: bool = False,
                limit: int = 20) -> dict[str, list[dict[str, Any]]]:
    """The firing alerts, recent transitions, stop decisions and runs not making progress:
    what ``rlmon alerts --json`` prints."""
    found: dict[str, list[dict[str, Any]]] = {"firing": store.firing_alerts(run)}
    if not firing_only:
        found["recent"] = store.recent_alerts(run, max(limit, 0))
    found["stops"] = [d.to_json() for d in store.stops(run)]
    # runs not simply running, by time (docs/liveness.md): slow, stalled, frozen, dead, failed,
    # preempted
    states = store.liveness(run)
    found["liveness"] = [row for row in states if row["state"] in (
        "slow", "stalled", "frozen", "dead", "failed", "preempted")]
    if not firing_only:  # runs that ended well, and how (latest first): said, not paged
        finished = sorted((row for row in states if row["state"] == "finished"),
                          key=lambda row: -(row["since"] or 0.0))
        found["finished"] = finished[:max(limit, 0)]
    return found


def _aligned(spread: Extremes, steps: Sequence[int]) -> dict[str, list[float | None]] | None:
    """Per-rank extremes at ``steps`` (null where a step has none, or a non-finite one: the
    curve marks those); None when none has."""
    at, lows, highs = spread
    x = np.asarray(steps, dtype=np.int64)
    if not len(at) or not len(x):
        return None
    where = np.minimum(np.searchsorted(at, x), len(at) - 1)
    hit = at[where] == x
    if not hit.any():
        return None

    def column(values: np.ndarray) -> list[float | None]:
        picked = np.where(hit, values[where], np.nan)
        out = picked.astype(object)
        out[~np.isfinite(picked)] = None
        return list(out.tolist())

    return {"min": column(lows), "max": column(highs)}


def _nonfinite(steps: Any, values: Any, reported: Any, buckets: int) -> dict[str, Any]:
    """Where a series reported NaN or ±inf (drawn as gaps, so the page marks them): how often,
    and the steps (the first of each of ``buckets`` equal step ranges when there are more)."""
    where = np.flatnonzero(reported)
    count = len(where)
    if count > buckets:
        span = int(steps[-1]) - int(steps[0]) + 1
        bucket = ((steps[where] - steps[0]) * buckets) // span
        where = where[np.r_[True, bucket[1:] != bucket[:-1]]]
    kinds = values[where]
    return {"count": count, "x": steps[where].tolist(),
            "value": ["NaN" if math.isnan(v) else "+Inf" if v > 0 else "-Inf"
                      for v in kinds.tolist()]}


class WebApi:
    """Answers the API's requests from one history store (see the module docstring)."""

    def __init__(self, store: HistoryStore, rules: Sequence[Rule] = (), *,
                 states: StreamStates | None = None, goodput: Goodput | None = None,
                 run_info: RunInfos | None = None, gpus: Callable[[str], float] | None = None,
                 price: Price | None = None, clock: Callable[[], float] = time.time) -> None:
        """``store``: a reader's own (read-only) store. ``rules``: the engine's, for the
        conditions in words. ``states``: the liveness state per (run, role) once the service
        keeps one (else each shows ``unknown``, and the age of its last step says the rest);
        ``goodput``: the productive fraction of each run's GPU time; ``run_info``: what each
        run reported of itself (framework, parallelism, algorithm: the runs table's columns);
        ``gpus``: a run's GPUs; ``price``: per GPU-hour, for the runs' cost."""
        self.store = store
        self.rules = {r.name: r for r in rules}
        self.states = states
        self.goodput = goodput
        self.run_info = run_info
        self.gpus = gpus
        self.price = price
        self.clock = clock
        self.columns = ColumnCache(store)
        # every metric name of a stream, read once and then from its new steps only
        self._names: dict[tuple[str, str, int], tuple[int, frozenset[str]]] = {}
        self._names_lock = threading.Lock()
        # each point's finalization time, per stream (also under _names_lock)
        self._step_times: dict[tuple[str, str, int], dict[int, float | None]] = {}
        (_seq, _name, file), = [r for r in store.read("PRAGMA database_list") if r[1] == "main"]
        self.diffs = DiffReads(store.read, Path(file) if file else None)

    def handle(self, path: str, params: Mapping[str, str]) -> tuple[str, bytes]:
        """(content type, body) of ``GET path``; raises :class:`ApiError`."""
        if path == "/api/trace":
            return "application/octet-stream", self.trace(params)
        handlers: dict[str, Callable[[Mapping[str, str]], Any]] = {
            "/api/runs": self.runs, "/api/curves": self.curves, "/api/alerts": self.alerts,
            "/api/alert": self.alert,
            "/api/metrics": self.metrics,
            "/api/diff": self.diff,
        }
        handler = handlers.get(path.rstrip("/"))
        if handler is None:
            raise ApiError(404, f"no such endpoint: {path} (see {', '.join(handlers)}, "
                                "/api/trace)")
        return "application/json", json.dumps(handler(params), allow_nan=False).encode()

    # --- runs ----------------------------------------------------------------------------------

    def runs(self, params: Mapping[str, str]) -> dict[str, Any]:
        """One row per run, its roles beneath (docs/page.md)."""
        firing: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for a in self.store.firing_alerts():
            firing.setdefault((a["run"], a["role"]), []).append(
                {"alert": a["alert"], "severity": a["severity"], "step": a["step"],
                 "metric": a["metric"]})
        # the liveness table the service writes at each state change (it outlives a restart),
        # overridden by the service's live view
        states = {(r["run"], r["role"]): r["state"] for r in self._liveness()}
        if self.states is not None:
            states.update(self.states())
        goodput = dict(self.goodput()) if self.goodput is not None else {}
        infos = dict(self.run_info()) if self.run_info is not None else {}
        now = self.clock()
        roles: dict[str, list[dict[str, Any]]] = {}
        for run, role, attempt, first, last in self._streams():
            (reporting, expected, complete, last_time), = self.store.read(
                "SELECT ranks_reporting, ranks_expected, complete, finalized_at FROM steps WHERE "
                "run = ? AND role = ? AND attempt = ? AND step = ?", (run, role, attempt, last))
            (first_time,), = self.store.read(
                "SELECT finalized_at FROM steps WHERE run = ? AND role = ? AND attempt = ? AND "
                "step = ?", (run, role, attempt, first))
            roles.setdefault(run, []).append({
                "run": run, "role": role, "attempt": attempt,
                "first_step": first, "last_step": last, "first_time": first_time,
                "last_time": last_time,
                "age_seconds": None if last_time is None else max(now - last_time, 0.0),
                "ranks_reporting": reporting, "ranks_expected": expected,
                "complete": bool(complete),
                "state": states.get((run, role), UNKNOWN),
                "firing": [{**a, "role": role} for a in firing.get((run, role), [])],
            })
        out = [self._run_row(run, rows, goodput.get(run), infos.get(run, {}), now)
               for run, rows in roles.items()]
        out.sort(key=lambda r: (-(r["last_time"] or 0.0), r["run"]))
        (latest,), = self.store.read("SELECT COALESCE(MAX(id), 0) FROM alerts")
        return {"runs": out, "alerts_seen": latest,
                "states_known": self.states is not None or bool(states), "now": now,
                "settings": sorted({k for r in out for k in r["settings"]}),
                "tags": sorted({t for r in out for t in r["tags"]}),
                "price": None if self.price is None or self.price.per_gpu_hour is None else {
                    "per_gpu_hour": self.price.per_gpu_hour, "currency": self.price.currency}}

    def _run_row(self, run: str, roles: list[dict[str, Any]], goodput: float | None,
                 info: Mapping[str, str], now: float) -> dict[str, Any]:
        """A run's row: its roles' worst state, its span in time, its GPUs and what they cost
        (GPUs times the run's duration, as alerts are priced), its settings."""
        roles.sort(key=lambda r: r["role"])
        state = run_state(r["state"] for r in roles)
        starts = [r["first_time"] for r in roles if r["first_time"] is not None]
        ends = [r["last_time"] for r in roles if r["last_time"] is not None]
        start = min(starts) if starts else None
        last_time = max(ends) if ends else None
        # a run that still holds its GPUs (running, slow, stalled, frozen) costs until now
        end = now if state in _HOLDING else last_time
        duration = max(end - start, 0.0) if start is not None and end is not None else None
        gpus = self.gpus(run) if self.gpus is not None else None
        gpus = gpus if gpus else None  # 0: the service has not counted the run's ranks yet
        gpu_hours = gpus * duration / 3600 if gpus is not None and duration is not None else None
        per_hour = self.price.per_gpu_hour if self.price is not None else None
        settings = {k: v for k, v in info.items() if v != "" and k not in ("framework", "tags")}
        tags = [t for t in info.get("tags", "").split(",") if t][:MAX_TAGS]
        return {
            "run": run, "state": state, "attempt": max(r["attempt"] for r in roles),
            "start": start, "last_time": last_time, "duration_seconds": duration,
            "age_seconds": None if last_time is None else max(now - last_time, 0.0),
            "first_step": min(r["first_step"] for r in roles),
            "last_step": max(r["last_step"] for r in roles),
            "ranks_expected": sum(r["ranks_expected"] for r in roles),
            "gpus": gpus, "gpu_hours": gpu_hours,
            "money": gpu_hours * per_hour if gpu_hours is not None and per_hour is not None
            else None,
            "goodput": _number(goodput) if goodput is not None else None,
            "firing": [a for r in roles for a in r["firing"]],
            "framework": info.get("framework") or self._relayed_framework(run, roles),
            "settings": settings,
            "tags": tags,
            "roles": roles,
        }

    def _relayed_framework(self, run: str, roles: list[dict[str, Any]]) -> str:
        """The framework a run's relayed names say (``openrlhf/...``), where the integration
        did not say it; "" for a home-grown loop."""
        for r in roles:
            for (name,) in self.store.read(
                    "SELECT j.key FROM steps s, json_each(s.line, '$.metrics') j WHERE s.run = ? "
                    "AND s.role = ? AND s.attempt = ? AND s.step = ?",
                    (run, r["role"], r["attempt"], r["last_step"])):
                prefix, sep, _ = str(name).partition("/")
                if sep and prefix in remedies.FRAMEWORKS:
                    return prefix
        return ""

    def _liveness(self, run: str | None = None) -> list[dict[str, Any]]:
        try:
            return self.store.liveness(run)
        except sqlite3.OperationalError:  # a store written before liveness was kept
            return []

    def _streams(self) -> list[tuple[str, str, int, int, int]]:
        """(run, role, latest attempt, first step, last step) of every stream, by seeks in the
        steps' primary key (run, role, attempt, step): a poll costs the same for a run of
        100,000 steps as for one of 10."""
        out: list[tuple[str, str, int, int, int]] = []
        key: tuple[str, str] | None = None
        while True:
            # past every attempt of the last stream: the seek lands on the next one
            found = self.store.read(
                "SELECT run, role FROM steps" + (" WHERE (run, role, attempt) > (?, ?, ?)"
                                                 if key else "")
                + " ORDER BY run, role LIMIT 1", (*key, 2**63 - 1) if key else ())
            if not found:
                return out
            key = (str(found[0][0]), str(found[0][1]))
            (attempt,), = self.store.read(
                "SELECT MAX(attempt) FROM steps WHERE run = ? AND role = ?", key)
            args = (*key, attempt)
            (first,), = self.store.read("SELECT MIN(step) FROM steps WHERE run = ? AND role = ? "
                                        "AND attempt = ?", args)
            (last,), = self.store.read("SELECT MAX(step) FROM steps WHERE run = ? AND role = ? "
                                       "AND attempt = ?", args)
            out.append((*key, int(attempt), int(first), int(last)))

    def warm(self, streams: int = 8) -> int:
        """Read the key columns of the most recently active streams into the cache (their new
        steps only, after the first time), so that opening a long run is a warm request;
        returns how many streams it read."""
        rows = [(r["run"], r["role"], r["attempt"]) for r in sorted(
            (s for run in self.runs({})["runs"] for s in run["roles"]),
            key=lambda s: -(s["last_time"] or 0.0))[:streams]]
        for run, role, attempt in rows:
            panels = self._panels(run, role, attempt)
            self.columns.get(run, role, attempt,
                             tuple(dict.fromkeys(m for p in panels for m in p.metrics)))
        for run, role, attempt in rows:  # then the picker's names (slower: every step line)
            self.metrics({"run": run, "role": role, "attempt": str(attempt)})
        return len(rows)

    # --- curves --------------------------------------------------------------------------------

    def _attempt(self, run: str, role: str, params: Mapping[str, str]) -> int:
        asked = _int_param(params, "attempt")
        if asked is not None:
            if not self.store.read("SELECT 1 FROM steps WHERE run = ? AND role = ? AND "
                                   "attempt = ? LIMIT 1", (run, role, asked)):
                raise ApiError(404, f"no steps of run {run!r} role {role!r} attempt {asked} "
                                    "in the history store")
            return asked
        (attempt,), = self.store.read(
            "SELECT MAX(attempt) FROM steps WHERE run = ? AND role = ?", (run, role))
        if attempt is None:
            raise ApiError(404, f"no steps of run {run!r} role {role!r} in the history store")
        return int(attempt)

    def _attempts(self, run: str, role: str) -> list[int]:
        """The stream's attempts, a seek in the steps' primary key each (not a scan of its
        steps)."""
        found: list[int] = []
        while True:
            (nxt,), = self.store.read("SELECT MIN(attempt) FROM steps WHERE run = ? AND role = ? "
                                      "AND attempt > ?", (run, role, found[-1] if found else -1))
            if nxt is None:
                return found
            found.append(int(nxt))

    def _roles(self, run: str) -> list[str]:
        return [r for (r,) in self.store.read(
            "SELECT DISTINCT role FROM steps WHERE run = ? ORDER BY role", (run,))]

    def _panels(self, run: str, role: str, attempt: int) -> list[Panel]:
        """The key panels of the metrics this role reports (its last step's names); a role with
        none of them gets one panel per metric it has."""
        names = {n for (n,) in self.store.read(
            "SELECT j.key FROM steps s, json_each(s.line, '$.metrics') j WHERE s.run = ? AND "
            "s.role = ? AND s.attempt = ? AND s.step = (SELECT MAX(step) FROM steps WHERE run = "
            "? AND role = ? AND attempt = ?)", (run, role, attempt, run, role, attempt))}
        (nonfinite,), = self.store.read(
            "SELECT json_extract(line, '$.nonfinite') FROM steps WHERE run = ? AND role = ? AND "
            "attempt = ? ORDER BY step DESC LIMIT 1", (run, role, attempt))
        names |= set(json.loads(nonfinite or "{}"))
        panels = [Panel(p.title, tuple(m for m in p.metrics if m in names)) for p in PANELS]
        panels = [p for p in panels if p.metrics]
        if panels:
            return panels
        return [Panel(n, (n,)) for n in sorted(names)[:_MAX_OTHER]]

    def curves(self, params: Mapping[str, str]) -> dict[str, Any]:
        run = _required(params, "run")
        roles = self._roles(run)
        if not roles:
            raise ApiError(404, f"no steps of run {run!r} in the history store")
        role = params.get("role") or ("actor" if "actor" in roles else roles[0])
        attempt = self._attempt(run, role, params)
        first = _int_param(params, "from")
        last = _int_param(params, "to")
        buckets = _int_param(params, "points", 500, 1, 100_000)
        assert buckets is not None
        picked = _picked(params)
        panels = [Panel(m, (m,)) for m in picked] if picked else self._panels(run, role, attempt)
        metrics = tuple(dict.fromkeys(m for p in panels for m in p.metrics))
        cols = self._columns(run, role, attempt, metrics)
        total_first = int(cols.steps[0]) if len(cols.steps) else None
        total_last = int(cols.steps[-1]) if len(cols.steps) else None
        shown = cols.window(first, last)
        out_panels = []
        kept = {}
        for panel in panels:
            kept[panel] = downsample(shown.steps, [shown.values[m] for m in panel.metrics],
                                     buckets)
        steps_kept = sorted({int(s) for keep in kept.values() for s in shown.steps[keep]})
        start_time = (self._times(run, role, attempt, [total_first]).get(total_first)
                      if total_first is not None else None)
        # seconds since the stream's first step, to the millisecond (a third of a unix time's
        # digits in the answer)
        times = {s: None if at is None or start_time is None else round(at - start_time, 3)
                 for s, at in self._times(run, role, attempt, steps_kept).items()}
        spread_of = self.store.rank_extremes(run, role, attempt, steps_kept, metrics)
        if catalog.STEP_SECONDS in spread_of:  # steps stored before the extremes: timelines
            stored = spread_of[catalog.STEP_SECONDS]
            known = set(stored[0].tolist())
            timed = {s: v for s, v in self._rank_spread(run, role, attempt, steps_kept).items()
                     if s not in known}
            if timed:
                both = sorted([*zip(stored[0].tolist(), zip(stored[1].tolist(),
                                                            stored[2].tolist(), strict=True),
                                    strict=True), *timed.items()])
                spread_of[catalog.STEP_SECONDS] = (
                    np.array([s for s, _ in both], dtype=np.int64),
                    np.array([v[0] for _, v in both]), np.array([v[1] for _, v in both]))
        for panel in panels:
            series = [shown.values[m] for m in panel.metrics]
            keep = kept[panel]
            xs = shown.steps[keep].tolist()
            out_panels.append({
                "title": panel.title,
                "unit": catalog.get(panel.metrics[0]).unit.value
                if catalog.lookup(panel.metrics[0]) else "",
                "metrics": list(panel.metrics),
                "help": [catalog.get(m).help if catalog.lookup(m) else "" for m in panel.metrics],
                "x": xs,
                "t": [times.get(x) for x in xs],
                "y": [[_number(v) for v in s[keep].tolist()] for s in series],
                "spread": [_aligned(spread_of[m], xs) if m in spread_of else None
                           for m in panel.metrics],
                "nonfinite": [_nonfinite(shown.steps, shown.values[m], shown.nonfinite[m],
                                         buckets) for m in panel.metrics],
            })
        lo = first if first is not None else total_first
        hi = last if last is not None else total_last
        attempts = self._attempts(run, role)
        return {
            "run": run, "role": role, "attempt": attempt, "attempts": attempts, "roles": roles,
            "first_step": total_first, "last_step": total_last, "steps": len(cols.steps),
            "start_time": start_time,
            "from": lo, "to": hi, "shown_steps": len(shown.steps), "points": buckets,
            "panels": out_panels,
            "alerts": self._transitions(run, role, attempt, lo, hi),
        }

    def _times(self, run: str, role: str, attempt: int, steps: Sequence[int],
               ) -> dict[int, float | None]:
        """When each of ``steps`` was finalized (unix seconds): a seek in the steps' primary key
        per step not asked for before, never a scan of the stream's lines (the steps are bound
        as one JSON array); a finalized step's time never changes, so it is kept (the streams
        last asked for)."""
        key = (run, role, attempt)
        with self._names_lock:
            known = self._step_times.pop(key, {})
            if len(known) > _TIMES_KEPT:  # many zooms of a long run: start again
                known = {}
            self._step_times[key] = known  # the most recently asked for last
            while len(self._step_times) > _TIMED_STREAMS:
                self._step_times.pop(next(iter(self._step_times)))
        missing = [s for s in steps if s not in known]
        if missing:
            found = {int(step): at for step, at in self.store.read(
                "SELECT step, finalized_at FROM steps WHERE run = ? AND role = ? AND attempt = ? "
                "AND step IN (SELECT value FROM json_each(?))",
                (run, role, attempt, json.dumps(missing)))}
            known.update(found)
        return {s: known.get(s) for s in steps}

    def _rank_spread(self, run: str, role: str, attempt: int, steps: Sequence[int],
                     ) -> dict[int, tuple[float, float]]:
        """The fastest and slowest rank's step time at each of ``steps`` that stored a timeline
        of two ranks or more: a rank's timeline spans its step, so its length is the rank's own
        ``perf/step_seconds`` (the step's value is the slowest rank's)."""
        if not steps:
            return {}
        # SQLite reads each rank's start and end (no Python object per span)
        return {int(step): (lo / 1e9, hi / 1e9) for step, lo, hi, ranks in self.store.read(
            "SELECT t.step, MIN(json_extract(r.value, '$.end') - json_extract(r.value, '$.start')),"
            " MAX(json_extract(r.value, '$.end') - json_extract(r.value, '$.start')), COUNT(*) "
            "FROM timelines t, json_each(t.data, '$.ranks') r WHERE t.run = ? AND t.role = ? AND "
            "t.attempt = ? AND t.step IN (SELECT value FROM json_each(?)) GROUP BY t.step",
            (run, role, attempt, json.dumps(list(steps)))) if ranks >= 2}

    def _columns(self, run: str, role: str, attempt: int, metrics: tuple[str, ...]) -> Columns:
        """The columns of ``metrics``: the key curves from the packed rows, any other metric
        from the step lines (each set cached on its own, so picking one metric does not read
        the key curves out of the step lines)."""
        packed = tuple(m for m in metrics if m in curve_rows.CURVE_METRICS)
        other = tuple(m for m in metrics if m not in curve_rows.CURVE_METRICS)
        if not packed or not other:
            return self.columns.get(run, role, attempt, metrics)
        a = self.columns.get(run, role, attempt, packed)
        b = self.columns.get(run, role, attempt, other)
        if not np.array_equal(a.steps, b.steps):  # a step arrived between the two reads
            return self.columns.get(run, role, attempt, metrics)
        return Columns(a.steps, {**a.values, **b.values}, a.count,
                       {**a.nonfinite, **b.nonfinite})

    def metrics(self, params: Mapping[str, str]) -> dict[str, Any]:
        """Every metric the stream reported (for the page's picker) and its attempts."""
        run = _required(params, "run")
        role = _required(params, "role")
        attempt = self._attempt(run, role, params)
        key = (run, role, attempt)
        with self._names_lock:
            known = self._names.get(key)
        (first, last), = self.store.read("SELECT MIN(step), MAX(step) FROM steps WHERE run = ? "
                                         "AND role = ? AND attempt = ?", key)
        after, names = known if known is not None else (
            (first - 1 if first is not None else 0), frozenset())
        # a long stream's lines are read a step range at a time: the page's other requests
        # (they share the reader's connection) wait for one range at most, not the whole run
        while last is not None and last > after:
            upto = min(after + _NAMES_STEPS, last)
            names = names | {n for (n,) in self.store.read(_METRIC_NAMES, (*key, after, upto))}
            after = upto
            with self._names_lock:
                self._names[key] = (after, names)
                while len(self._names) > 64:
                    self._names.pop(next(iter(self._names)))
        attempts = self._attempts(run, role)
        return {"run": run, "role": role, "attempt": attempt, "attempts": attempts,
                "metrics": sorted(names)}

    def diff(self, params: Mapping[str, str]) -> dict[str, Any]:
        """Where two stored runs part ways (what ``rlmon diff A B --json`` prints for them),
        bounded, cached and limited (:mod:`rlmon.service.web.diff_reads`)."""
        a, b = _required(params, "a"), _required(params, "b")
        try:
            return self.diffs.get(a, b)
        except DiffError as exc:
            raise ApiError(exc.status, str(exc)) from None

    def _transitions(self, run: str, role: str, attempt: int, lo: int | None,
                     hi: int | None) -> list[dict[str, Any]]:
        if lo is None or hi is None:
            return []
        # a resolve that only says the run ended with the alert firing, or that its level rule
        # took it over, is no resolve to draw
        ended = "ended_with_run" if self.store.has_column("alerts", "ended_with_run") else "0"
        handed = "handed_to != ''" if self.store.has_column("alerts", "handed_to") else "0"
        rows = self.store.read(
            "SELECT step, alert, severity, state, metric, value, " + ended + " OR " + handed
            + " FROM alerts "
            "WHERE run = ? AND role = ? AND attempt = ? AND step BETWEEN ? AND ? ORDER BY id",
            (run, role, attempt, lo, hi))
        keys = ("step", "alert", "severity", "state", "metric", "value")
        return [dict(zip(keys, row[:-1], strict=True)) for row in rows if not row[-1]]

    # --- alerts --------------------------------------------------------------------------------

    def alerts(self, params: Mapping[str, str]) -> dict[str, list[dict[str, Any]]]:
        limit = _int_param(params, "limit", 20, 0, 100_000)
        assert limit is not None
        return alerts_json(self.store, params.get("run") or None,
                           params.get("firing", "") in ("1", "true"), limit)

    def alert(self, params: Mapping[str, str]) -> dict[str, Any]:
        run, role, name = (_required(params, k) for k in ("run", "role", "alert"))
        step = _int_param(params, "step")
        incident = _incident(self.store, run, role, name, step)
        if incident is None:
            at = f" at step {step}" if step is not None else ""
            raise ApiError(404, f"alert {name!r} of run {run!r} role {role!r} never fired{at}")
        fired, escalation, resolved_row = incident
        onset, severity, metric, value, attempt = (fired["step"], fired["severity"],
                                                   fired["metric"], fired["value"],
                                                   int(fired["attempt"] or 0))
        resolved_step = resolved_row["step"] if resolved_row is not None else None
        rule = self.rules.get(name)
        spec = catalog.lookup(metric) if metric else None
        timed = next((a for a in catalog.LIVENESS_ALERTS if a.name == name), None)
        liveness = next((r for r in self._liveness(run) if r["role"] == role), None)
        around = None
        if metric:
            cols = self.columns.get(run, role, attempt, (metric,))
            near = cols.window(onset - _AROUND, onset + _AROUND)
            around = {"metric": metric, "x": near.steps.tolist(),
                      "y": [_number(v) for v in near.values[metric].tolist()],
                      "nonfinite": _nonfinite(near.steps, near.values[metric],
                                              near.nonfinite[metric], 2 * _AROUND + 1)}
        # the incident's cost so far: the resolve's (the whole incident), else the latest firing
        latest = resolved_row or escalation or fired
        return {
            "run": run, "role": role, "attempt": attempt, "alert": name,
            # the severity now: a warning that escalated is critical (one incident)
            "severity": escalation["severity"] if escalation is not None else severity,
            "first_severity": severity,
            "escalated_at": escalation["step"] if escalation is not None else None,
            "escalated_value": escalation["value"] if escalation is not None else None,
            "critical_condition": (rule.describe_critical() if rule is not None
                                   and escalation is not None else ""),
            "metric": metric, "value": value, "onset": onset, "resolved": resolved_step,
            # JSON has no NaN: which non-finite value a null "value" stands for ('' if none)
            "nonfinite": fired.get("nonfinite") or "",
            # closed because the run ended with it firing: the run is over, not the condition
            "ended_with_run": bool(resolved_row is not None and resolved_row.get("ended_with_run")),
            # closed because its level rule fires now: the condition goes on under that name
            "handed_to": str(resolved_row.get("handed_to") or "") if resolved_row is not None
            else "",
            "firing": resolved_step is None,
            "cost": {"gpu_hours": latest.get("gpu_hours"), "money": latest.get("money"),
                     "note": latest.get("cost_note") or ""},
            "framework": self._framework(run, role, attempt),
            "what_to_change": remedies.remedy_text(name, self._framework(run, role, attempt)),
            "first_moved": self._first_moved(run, name, attempt, onset),
            "condition": rule.describe() if rule is not None else "",
            "summary": rule.summary if rule is not None else "",
            "what_to_check": what_to_check(
                rule.condition if rule is not None
                else Condition(timed.condition) if timed is not None else None, metric),
            "liveness": liveness if timed is not None else None,
            "help": spec.help if spec is not None else "",
            "around": around,
            "samples": self._samples(run, role, onset, metric),
            "timeline": self._timeline(run, role, onset),
            "trace": f"/api/trace?run={_q(run)}&role={_q(role)}&from={onset}&to={onset}",
        }

    def _framework(self, run: str, role: str, attempt: int) -> str:
        """The run's framework as its relayed keys name it (``openrlhf/...``), "" else: the
        keys of what to change (the service names it from RunInfo too; a store does not keep
        that)."""
        names = self.metrics({"run": run, "role": role, "attempt": str(attempt)})["metrics"]
        for name in names:
            prefix, sep, _ = name.partition("/")
            if sep and prefix in remedies.FRAMEWORKS:
                return prefix
        return ""

    def _first_moved(self, run: str, alert: str, attempt: int, onset: int) -> str:
        """Which related metric left its baseline first before the onset, over every role of
        the run (the service's sentence, from the stored steps)."""
        if alert not in first_mover.RELATED:
            return ""
        history: dict[str, list[tuple[int, float]]] = {}
        lo = onset - first_mover.LOOKBACK - first_mover.BASELINE
        wanted = tuple(sorted(first_mover.TRACKED))
        for role in self._roles(run):
            cols = self.columns.get(run, role, attempt, wanted).window(lo, onset)
            for metric in wanted:
                values = cols.values[metric]
                points = [(int(s), float(v)) for s, v in zip(cols.steps.tolist(),
                                                             values.tolist(), strict=True)
                          if math.isfinite(v)]
                if points and metric not in history:
                    history[metric] = points
        return first_mover.first_moved(alert, history, onset)

    def _samples(self, run: str, role: str, step: int, metric: str) -> list[dict[str, Any]]:
        """The worst samples stored at ``step``: the alert metric's sample metric first (all of
        the step's sample metrics when it has none stored)."""
        wanted = catalog.samples_for(metric) if metric else None
        found = self.store.samples(run, role, step, wanted) if wanted else []
        if not found:
            found = self.store.samples(run, role, step)
        return [{"metric": s.metric, "step": s.step, "cut": s.cut,
                 "items": items_to_json(s.items)} for s in found]

    def _timeline(self, run: str, role: str, step: int) -> dict[str, Any] | None:
        stored = self.store.timelines(run, role, step, step)
        if not stored:
            return None
        t = stored[0]
        return {"step": t.step, "cut": t.cut, "ranks": [r.to_json() for r in t.ranks]}

    def trace(self, params: Mapping[str, str]) -> bytes:
        from rlmon.service.export.perfetto import TraceInput, build_trace

        run = _required(params, "run")
        role = params.get("role") or None
        first = _int_param(params, "from", 0)
        last = _int_param(params, "to")
        assert first is not None
        # a bounded read (issue 40): a range of steps, never a whole run's timelines at once
        if last is None or last - first >= _TRACE_STEPS:
            raise ApiError(400, f"from, to: a trace covers at most {_TRACE_STEPS} steps "
                                f"(asked: {first}:{'' if last is None else last}); rlmon trace "
                                "writes longer ones")
        timelines = self.store.timelines(run, role, first, last)
        if not timelines:
            raise ApiError(404, f"no timelines of run {run!r} in steps {first}:"
                                f"{'' if last is None else last}")
        steps = [json.loads(line) for (line,) in self.store.read(
            "SELECT line FROM steps WHERE run = ? AND step BETWEEN ? AND ?"
            + (" AND role = ?" if role else "") + " ORDER BY role, attempt, step",
            [run, first, last if last is not None else 2**62, *([role] if role else [])])]
        alerts = [a for a in self.store.alerts(run)
                  if first <= a["step"] <= (last if last is not None else a["step"])]
        return build_trace(TraceInput(timelines, alerts, steps))


def _incident(store: HistoryStore, run: str, role: str, alert: str, step: int | None,
              ) -> tuple[dict[str, Any], dict[str, Any] | None, dict[str, Any] | None] | None:
    """(firing, escalation, resolve) rows of one incident of the alert: the one that fired (or
    escalated) at ``step``, else the latest; a firing while one is open is its escalation."""
    incidents: list[list[dict[str, Any] | None]] = []
    open_: dict[int, list[dict[str, Any] | None]] = {}
    for row in store.alerts(run, cost=True):
        if row["role"] != role or row["alert"] != alert:
            continue
        attempt = int(row["attempt"] or 0)
        held = open_.get(attempt)
        if row["state"] == "firing":
            if held is None:
                held = open_[attempt] = [row, None, None]
                incidents.append(held)
            else:
                held[1] = row
        elif held is not None:
            held[2] = row
            del open_[attempt]
    if step is not None:
        incidents = [i for i in incidents if any(r is not None and r["state"] == "firing"
                                                 and r["step"] == step for r in i[:2])]
    if not incidents:
        return None
    fired, escalation, resolved = incidents[-1]
    assert fired is not None
    return fired, escalation, resolved


def _q(text: str) -> str:
    from urllib.parse import quote

    return quote(text, safe="")
