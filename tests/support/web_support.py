"""A service fed the bundled example run, for the run page's tests, bench and screenshot, and a
GET of its page; and a headless Chromium driven by Playwright."""

from __future__ import annotations

import json
import os
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from rlmon.service.contract.step_record import StepRecord
from rlmon.service.contract.timeline import RankTimeline, Span, Timeline
from rlmon.service.metrics.rank import Rank
from rlmon.service.replay import replay
from rlmon.service.service_core import ServiceCore

__all__ = ["CHROMIUM_ARGS", "browser", "example_records", "fed_service", "get", "need_chromium",
           "serving", "with_timeline"]

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def need_chromium() -> str:
    """Chromium's path; skip without it (or without Playwright), fail with
    RLMON_REQUIRE_INTEGRATION=1 (make system-deps installs it)."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    problem = None if path else "chromium not installed (make system-deps installs it)"
    try:
        import playwright  # noqa: F401
    except ImportError:
        problem = problem or "playwright not installed (the dev extra has it)"
    if problem is not None:
        if os.environ.get("RLMON_REQUIRE_INTEGRATION") == "1":
            pytest.fail(problem)
        pytest.skip(problem)
    assert path is not None
    return path


@contextmanager
def browser(executable: str) -> Iterator[Any]:
    """A headless Chromium (Debian's, not a Playwright download)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


def with_timeline(record: StepRecord, ranks: int = 4) -> StepRecord:
    """The record with a made-up timeline per rank (the example run carries none)."""
    base = 1_700_000_000_000_000_000 + record.step * 2_000_000_000
    timelines = []
    for i in range(ranks):
        slow = 300_000_000 if i == ranks - 1 else 0
        spans = (Span("generate", base, base + 600_000_000),
                 Span("train", base + 650_000_000, base + 1_400_000_000 + slow),
                 Span("backward", base + 900_000_000, base + 1_300_000_000 + slow, depth=1))
        timelines.append(RankTimeline(Rank(dp=i // 2, cp=i % 2), Timeline(
            base, base + 1_500_000_000 + slow, spans, host="node-0", pid=1000 + i)))
    return replace(record, timelines=tuple(timelines))


def example_records() -> list[StepRecord]:
    """The bundled example run's steps, as the service receives them (alert onsets with
    timelines)."""
    data = resources.files("rlmon") / "data" / "example_run.jsonl"
    with data.open("rb") as handle:
        result = replay(handle)
    onsets = {(e.role, e.step) for e in result.alerts if e.state == "firing"}
    return [with_timeline(r) if (r.role, r.step) in onsets else r for r, _ in result.steps]


def fed_service(state_dir: Path, records: list[StepRecord], port: int = 0,
                **settings: Any) -> ServiceCore:
    """A service on a free loopback port whose history holds ``records``."""
    from rlmon.service.config import load_config

    core = ServiceCore(load_config(None, **settings), state_dir=state_dir, port=port,
                       host="127.0.0.1").start()
    core.publish(records)
    core.goodput.account()  # settled: the ledger's own thread may still be accounting them
    return core


@contextmanager
def serving(state_dir: Path, records: list[StepRecord], **settings: Any) -> Iterator[ServiceCore]:
    """:func:`fed_service`, closed at once when the block ends (nothing left to deliver)."""
    core = fed_service(state_dir, records, **settings)
    try:
        yield core
    finally:
        core.close(0.0)


def get(core: ServiceCore, path: str, headers: dict[str, str] | None = None,
        ) -> tuple[int, Any, dict[str, str]]:
    """GET ``path`` of ``core``'s page: the status, the body (parsed when JSON), the headers."""
    request = urllib.request.Request(f"http://127.0.0.1:{core.port}{path}", headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            body, status, head = resp.read(), resp.status, dict(resp.headers)
    except urllib.error.HTTPError as exc:
        body, status, head = exc.read(), exc.code, dict(exc.headers)
    if head.get("Content-Type", "").startswith("application/json"):
        return status, json.loads(body), head
    return status, body, head
