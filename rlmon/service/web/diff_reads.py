"""``/api/diff``, the page's read over whole runs, bounded (issue 40, E11).

Two 100,000-step runs read whole took 6.9 s and 1.16 GB in the actor that holds the alert
engine; six requests at once, 3.18 GB. So a diff:

- **reads a bounded number of values** per run (:class:`DiffBudget`): a run longer than the
  budget is read one step per bucket of ``stride`` steps (the same buckets for both runs, so
  their common steps stay common), and the answer says so (``read``: the stride, the steps and
  values read, whether a run was cut short);
- **is computed once per pair and version**: the answer is cached under the two runs' versions
  (their steps' count, last step, last attempt and last finalization), and a request for a diff
  already being computed waits for that one;
- **is limited in concurrency**: ``concurrent`` diffs at a time; another pair asked meanwhile is
  answered 503 (retry), never queued behind it;
- **runs in a child process** when the store is a file (the service's case, read-only), at a
  lower CPU priority: its memory and CPU are never the service's, so ``/metrics``, the alert
  path and the page's other requests do not wait on it.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sqlite3
import subprocess
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlmon.service.wording import counted

__all__ = ["DiffBudget", "DiffReads", "bounded_diff"]

Rows = Callable[[str, Sequence[Any]], Iterable[tuple[Any, ...]]]
Version = tuple[Any, ...]

# the strided read: the first step of each bucket of `stride` steps, per role and attempt (an IN
# list SQLite indexes once; a join on the grouped steps was searched row by row: 77 s for 10,000)
_STRIDED = (
    "SELECT line FROM steps WHERE run = ?1 AND (role, attempt, step) IN (SELECT role, attempt, "
    "MIN(step) FROM steps WHERE run = ?1 GROUP BY role, attempt, step / ?2) "
    "ORDER BY role, attempt, step")


class DiffError(Exception):
    """A diff that cannot be answered: ``status`` and a message naming the parameter."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class DiffBudget:
    """How much one diff may read and hold."""

    values: int = 400_000  # metric values read per run, at most
    concurrent: int = 1  # diffs computed at once
    cached: int = 16  # answers kept (pairs and versions)
    timeout: float = 600.0  # seconds a diff may take (then 504): its process is niced


@dataclass(frozen=True, slots=True)
class _Shape:
    rows: int
    first: int
    last: int
    streams: int  # (role, attempt) pairs
    width: int  # metrics in its last step line


def _shape(rows: Rows, run: str, name: str) -> _Shape:
    (count, first, last), = rows("SELECT COUNT(*), MIN(step), MAX(step) FROM steps WHERE "
                                 "run = ?", (run,))
    if not count:
        raise DiffError(404, f"{name}: no steps of run {run!r} in the history store")
    (streams,), = rows("SELECT COUNT(*) FROM (SELECT 1 FROM steps WHERE run = ? GROUP BY role, "
                       "attempt)", (run,))
    (line,), = rows("SELECT line FROM steps WHERE run = ? ORDER BY step DESC LIMIT 1", (run,))
    last_line = json.loads(line)
    width = len(last_line.get("metrics", {})) + len(last_line.get("nonfinite", {}))
    return _Shape(int(count), int(first), int(last), int(streams), max(width, 1))


def bounded_diff(rows: Rows, a: str, b: str, budget: DiffBudget) -> dict[str, Any]:
    """What ``rlmon diff A B --json`` prints for two stored runs, from at most
    ``budget.values`` values of each (``rows`` runs one read query and yields its rows)."""
    from rlmon.service.diff import diff_runs
    from rlmon.service.diff.runs import from_step_lines

    shapes = {a: _shape(rows, a, "a"), b: _shape(rows, b, "b")}
    # one stride for both runs: the buckets are the same, so are the steps they keep
    stride = max(1, *(math.ceil((s.last - s.first + 1) * s.streams * s.width / budget.values)
                      for s in shapes.values()))
    read: dict[str, Any] = {"stride": stride, "budget_values": budget.values}
    series = []
    for label, run in (("a", a), ("b", b)):
        lines: list[dict[str, Any]] = []
        values = 0
        cut = False
        for (text,) in rows(_STRIDED, (run, stride)):
            line = json.loads(text)
            values += len(line.get("metrics", {})) + len(line.get("nonfinite", {}))
            if values > budget.values:  # wider than its last step said: cut here, said so
                cut = True
                break
            lines.append(line)
        read[label] = {"steps": len(lines), "steps_stored": shapes[run].rows,
                       "values": min(values, budget.values), "cut": cut}
        series.append(from_step_lines(lines, run, "history store"))
        del lines
    out = diff_runs(series[0], series[1]).to_json()
    out["read"] = read
    if stride > 1 or read["a"]["cut"] or read["b"]["cut"]:
        out["headline"] += (f" (read one step in {stride}: at most {budget.values:,} values "
                            "per run)")
    return out


@dataclass
class _Pending:
    done: threading.Event = field(default_factory=threading.Event)
    answer: dict[str, Any] | None = None
    error: Exception | None = None


class DiffReads:
    """The page's diffs: cached per pair and version, ``budget.concurrent`` at a time, each in a
    child process when the store is a file (``path``), else in the calling thread.
    ``compute(a, b)`` replaces the computation (tests hold one open with it)."""

    def __init__(self, rows: Rows, path: Path | None, budget: DiffBudget | None = None,
                 compute: Callable[[str, str], dict[str, Any]] | None = None) -> None:
        self.rows = rows
        self.path = path
        self.budget = budget or DiffBudget()
        self._compute = compute or self._default_compute
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(self.budget.concurrent)
        self._cache: OrderedDict[tuple[str, str, Version, Version], dict[str, Any]] = \
            OrderedDict()
        self._pending: dict[tuple[str, str, Version, Version], _Pending] = {}
        self.computed = 0  # diffs computed (not answered from the cache)
        self.refused = 0  # answered 503: the concurrency limit was reached

    def version(self, run: str) -> Version:
        """What changes when the run's stored steps change (a new step, a new attempt, a
        retention pass)."""
        (found,) = self.rows("SELECT COUNT(*), MAX(step), MAX(attempt), MAX(finalized_at) FROM "
                             "steps WHERE run = ?", (run,))
        return tuple(found)

    def get(self, a: str, b: str) -> dict[str, Any]:
        key = (a, b, self.version(a), self.version(b))
        for name, run, version in (("a", a, key[2]), ("b", b, key[3])):
            if not version[0]:
                raise DiffError(404, f"{name}: no steps of run {run!r} in the history store")
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                return cached
            pending = self._pending.get(key)
            owner = pending is None
            if pending is None:
                if not self._slots.acquire(blocking=False):
                    self.refused += 1
                    raise DiffError(503, f"{counted(self.budget.concurrent, 'diff')} already being "
                                         "computed; retry in a few seconds")
                pending = self._pending[key] = _Pending()
        if not owner:  # the same pair and version: wait for the one being computed
            if not pending.done.wait(self.budget.timeout):
                raise DiffError(504, "the diff took too long")
            if pending.error is not None:
                raise pending.error
            assert pending.answer is not None
            return pending.answer
        try:
            pending.answer = self._compute(a, b)
            self.computed += 1
            return pending.answer
        except Exception as exc:
            pending.error = exc
            raise
        finally:
            with self._lock:
                self._pending.pop(key, None)
                if pending.answer is not None:
                    self._cache[key] = pending.answer
                    while len(self._cache) > self.budget.cached:
                        self._cache.popitem(last=False)
            self._slots.release()
            pending.done.set()

    def _default_compute(self, a: str, b: str) -> dict[str, Any]:
        if self.path is None:  # an in-memory store (tests): only this process can read it
            return bounded_diff(self.rows, a, b, self.budget)
        request = json.dumps({"path": str(self.path), "a": a, "b": b,
                              "values": self.budget.values})
        try:
            done = subprocess.run([sys.executable, "-m", "rlmon.service.web.diff_reads"],
                                  input=request, capture_output=True, text=True,
                                  timeout=self.budget.timeout, check=False)
        except subprocess.TimeoutExpired:
            raise DiffError(504, f"the diff took longer than {self.budget.timeout:.0f} s") \
                from None
        try:
            answer: dict[str, Any] = json.loads(done.stdout)
        except ValueError:
            tail = done.stderr.strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
            raise DiffError(500, f"the diff's process failed: {tail[0]}") from None
        if "error" in answer and "status" in answer:
            raise DiffError(int(answer["status"]), str(answer["error"]))
        return answer


def _child() -> int:
    """The child process: one diff from the store file named on stdin, its JSON on stdout."""
    from rlmon.service.storage.history import check_history_schema

    request = json.loads(sys.stdin.read())
    with contextlib.suppress(OSError):
        os.nice(10)  # below the service: its scrapes and alerts come first
    path = Path(request["path"])
    db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        check_history_schema(db, str(path))

        def rows(query: str, args: Sequence[Any]) -> Iterable[tuple[Any, ...]]:
            return db.execute(query, args)  # a cursor: rows one at a time

        answer = bounded_diff(rows, request["a"], request["b"],
                              DiffBudget(values=int(request["values"])))
    except DiffError as exc:
        answer = {"error": str(exc), "status": exc.status}
    finally:
        db.close()
    sys.stdout.write(json.dumps(answer, allow_nan=False))
    return 0


if __name__ == "__main__":
    sys.exit(_child())
