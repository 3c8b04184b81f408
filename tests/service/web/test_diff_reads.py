"""The page's diff is bounded (issue 40, E11): it reads at most its budget of values per run
(counted, not timed), is computed once per pair and version, a limited number at a time (another
pair is refused while one is computed, the same pair waits for it), runs in a child process when
the store is a file, and never holds up ``/metrics`` or the page's other requests. Checked with a
diff held open by an event, never with a timing."""

from __future__ import annotations

import json
import math
import threading
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from rlmon.service.export.exporter import MetricsState
from rlmon.service.export.http import serve_metrics
from rlmon.service.storage.history import HistoryStore
from rlmon.service.web.api import WebApi
from rlmon.service.web.diff_reads import DiffBudget, DiffError, DiffReads, bounded_diff
from rlmon.service.web.server import WebApp
from tests.support.records import step_record

STEPS = 3_000
METRICS = 8


def _runs(store: HistoryStore, steps: int = STEPS, first: int = 0) -> None:
    """Two runs alike but for actor/entropy, which collapses in ``b`` from step 1,500."""
    records = []
    for step in range(first, first + steps):
        noise = math.sin(step * 12.9898) * 0.01
        values = {f"actor/m{i}": 1.0 + i + noise for i in range(METRICS - 1)}
        records.append(step_record(run="a", step=step,
                                   metrics={**values, "actor/entropy": 1.0 + noise}))
        records.append(step_record(run="b", step=step, metrics={
            **values, "actor/entropy": (0.05 if step >= 1_500 else 1.0) + noise}))
    store.add(records)


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("diff") / "history.sqlite"
    store = HistoryStore(path)
    _runs(store)
    store.close()
    return path


class Counting:
    """The rows a diff reads, counted (the values of each step line it parses)."""

    def __init__(self, store: HistoryStore) -> None:
        self.store = store
        self.values = 0

    def __call__(self, query: str, args: Sequence[Any]) -> Iterable[tuple[Any, ...]]:
        rows = self.store.read(query, args)
        for row in rows:
            if len(row) == 1 and isinstance(row[0], str) and row[0].startswith("{"):
                line = json.loads(row[0])
                self.values += len(line.get("metrics", {})) + len(line.get("nonfinite", {}))
        return rows


def test_a_diff_reads_at_most_its_budget_and_still_finds_the_parting(stored: Path) -> None:
    store = HistoryStore(stored, read_only=True)
    try:
        whole = bounded_diff(store.read, "a", "b", DiffBudget(values=10**9))
        assert whole["read"]["stride"] == 1 and whole["read"]["a"]["steps"] == STEPS
        counting = Counting(store)
        budget = DiffBudget(values=4_000)
        answer = bounded_diff(counting, "a", "b", budget)
        read = answer["read"]
        # a 3,000-step run of 8 metrics in 4,000 values: one step in 6, for both runs alike
        assert read["stride"] == 6
        for label in ("a", "b"):
            assert read[label]["values"] <= budget.values
            assert read[label]["steps"] == STEPS // 6 and read[label]["steps_stored"] == STEPS
        # every value parsed (both runs, and the two lines that measure them) within budget
        assert counting.values <= 2 * budget.values + 2 * METRICS
        assert answer["common_steps"] == STEPS // 6
        assert answer["metric"] == "actor/entropy" and 1_500 <= answer["step"] <= 1_600
        assert "read one step in 6" in answer["headline"]
    finally:
        store.close()


def test_a_run_wider_than_its_last_step_is_cut_at_the_budget(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / "history.sqlite")
    try:
        wide = {f"actor/w{i}": float(i) for i in range(500)}
        store.add([step_record(run=run, step=s, metrics=wide) for s in range(40)
                   for run in ("a", "b")]
                  + [step_record(run=run, step=40, metrics={"actor/w0": 0.0})
                     for run in ("a", "b")])
        answer = bounded_diff(store.read, "a", "b", DiffBudget(values=5_000))
        assert answer["read"]["a"]["cut"] and answer["read"]["a"]["values"] <= 5_000
        assert answer["read"]["a"]["steps"] == 10  # 10 lines of 500 values, then cut
    finally:
        store.close()


def test_one_diff_per_pair_and_version(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / "history.sqlite")
    _runs(store, steps=60)
    computed: list[tuple[str, str]] = []

    def compute(a: str, b: str) -> dict[str, Any]:
        computed.append((a, b))
        return bounded_diff(store.read, a, b, DiffBudget())

    reads = DiffReads(store.read, None, compute=compute)
    try:
        first = reads.get("a", "b")
        assert reads.get("a", "b") is first and computed == [("a", "b")]
        assert reads.get("b", "a") is not first  # the other way round is another answer
        _runs(store, steps=1, first=60)  # a new step: a new version of both runs
        assert reads.get("a", "b")["read"]["a"]["steps"] == 61
        assert computed == [("a", "b"), ("b", "a"), ("a", "b")] and reads.computed == 3
        with pytest.raises(DiffError, match=r"b: no steps of run 'nothing'") as info:
            reads.get("a", "nothing")
        assert info.value.status == 404 and reads.computed == 3
    finally:
        store.close()


def _get(port: int, path: str) -> tuple[int, Any]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.fixture
def held(stored: Path) -> Iterator[tuple[WebApi, int, threading.Event, threading.Event]]:
    """A page server whose diffs wait for ``release`` once they have ``started``."""
    reader = HistoryStore(stored, read_only=True)
    api = WebApi(reader)
    started, release = threading.Event(), threading.Event()
    real = api.diffs._compute

    def compute(a: str, b: str) -> dict[str, Any]:
        started.set()
        assert release.wait(60), "the test never released the diff"
        return real(a, b)

    api.diffs._compute = compute
    server = serve_metrics(MetricsState(), port=0, host="127.0.0.1", web=WebApp(api))
    yield api, server.port, started, release
    release.set()
    server.close()
    reader.close()


def test_diffs_are_limited_and_never_hold_up_metrics_or_the_page(
        held: tuple[WebApi, int, threading.Event, threading.Event]) -> None:
    api, port, started, release = held
    answers: list[tuple[int, Any]] = []
    first = threading.Thread(target=lambda: answers.append(_get(port, "/api/diff?a=a&b=b")))
    first.start()
    assert started.wait(30)
    # the same pair and version: waits for the diff being computed, not a second one
    same = threading.Thread(target=lambda: answers.append(_get(port, "/api/diff?a=a&b=b")))
    same.start()
    # another pair while the limit is reached: refused at once, not queued
    status, body = _get(port, "/api/diff?a=b&b=a")
    assert status == 503 and "retry" in json.loads(body)["error"]
    assert api.diffs.refused == 1
    # the scrape, the health probe and the page's other reads answer meanwhile
    assert _get(port, "/metrics")[0] == 200
    assert _get(port, "/healthz")[0] == 200
    assert _get(port, "/api/runs")[0] == 200
    assert first.is_alive()  # still held: everything above was answered beside it
    release.set()
    first.join(60)
    same.join(60)
    assert [s for s, _ in answers] == [200, 200] and answers[0][1] == answers[1][1]
    assert api.diffs.computed == 1
    assert json.loads(answers[0][1])["metric"] == "actor/entropy"


def test_a_file_store_is_diffed_in_a_child_process(stored: Path) -> None:
    """The service's store is a file: the diff runs in a child (its memory and CPU are not the
    service's) and answers what the same bounded read answers here."""
    reader = HistoryStore(stored, read_only=True)
    try:
        api = WebApi(reader)
        assert api.diffs.path == stored
        child = api.diffs.get("a", "b")
        here = bounded_diff(reader.read, "a", "b", api.diffs.budget)
        assert child == json.loads(json.dumps(here))
        with pytest.raises(DiffError) as info:
            DiffReads(reader.read, stored, DiffBudget(timeout=60)).get("a", "zzz")
        assert info.value.status == 404
    finally:
        reader.close()


def test_a_trace_covers_a_bounded_range_of_steps(stored: Path) -> None:
    """The page's other read that could span a whole run: a trace is asked for a range of at
    most 1,000 steps (the alert page links one step), never a whole run."""
    from rlmon.service.web.api import ApiError

    reader = HistoryStore(stored, read_only=True)
    try:
        api = WebApi(reader)
        for params in ({"run": "a"}, {"run": "a", "from": "0"}, {"run": "a", "to": "1000"},
                       {"run": "a", "from": "10", "to": "1010"}):
            with pytest.raises(ApiError, match="at most 1000 steps") as info:
                api.handle("/api/trace", params)
            assert info.value.status == 400
        with pytest.raises(ApiError, match="no timelines"):  # in range: read (none stored)
            api.handle("/api/trace", {"run": "a", "from": "10", "to": "1009"})
    finally:
        reader.close()


def test_the_strided_read_seeks_each_step_it_keeps(stored: Path) -> None:
    """The read's plan, not its time: each kept step is a seek in the steps' primary key (a
    join on the grouped steps was searched row by row instead, 77 s for 10,000 steps)."""
    from rlmon.service.web.diff_reads import _STRIDED

    reader = HistoryStore(stored, read_only=True)
    try:
        plan = " / ".join(str(row[3]) for row in reader.read("EXPLAIN QUERY PLAN " + _STRIDED,
                                                              ("a", 6)))
        assert "(run=? AND role=? AND attempt=? AND step=?)" in plan, plan
        assert "AUTOMATIC" not in plan, plan
    finally:
        reader.close()
