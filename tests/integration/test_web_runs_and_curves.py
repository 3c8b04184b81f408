"""The run page's runs table and curve controls, and its drawing defects (issues 38, 39, 42), in
Debian's headless Chromium driven by Playwright, checked by what the page renders: the table's
rows and cells, uPlot's drawn data and scales, and pixels of the canvas. With
RLMON_UPDATE_SCREENSHOT=1 the screenshots of docs/page.md are written to docs/.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from rlmon.service.contract.step_record import StepRecord
from rlmon.service.service_core import ServiceCore
from tests.support.web_support import (
    browser,
    example_records,
    fed_service,
    need_chromium,
    with_timeline,
)

pytestmark = pytest.mark.integration

RUN = "grpo-demo-0"
DOCS = Path(__file__).resolve().parents[2] / "docs"
T0 = time.time() - 3000  # the example run's steps finalized 10 s apart from here


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    with browser(need_chromium()) as b:
        yield b


@pytest.fixture
def records() -> list[StepRecord]:
    return [replace(r, finalized_at=T0 + 10 * r.step) for r in example_records()]


@pytest.fixture
def service(tmp_path: Path, records: list[StepRecord]) -> Iterator[ServiceCore]:
    core = fed_service(tmp_path, records)
    yield core
    core.close(0.0)


@pytest.fixture
def page(chromium: Any, service: ServiceCore, tmp_path: Path) -> Iterator[Any]:
    context = chromium.new_context(viewport={"width": 1400, "height": 1000})
    tab = context.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    tab.base = f"http://127.0.0.1:{service.port}/?poll=250"
    yield tab
    (tmp_path / "page.html").write_text(tab.content())
    context.close()
    assert not errors, f"the page raised: {errors}"


def shown_runs(tab: Any) -> list[str]:
    return list(tab.eval_on_selector_all("#runs tr.run-row", "rs => rs.map(r => r.dataset.run)"))


def cells(tab: Any, col: str) -> list[str]:
    return list(tab.eval_on_selector_all(f"#runs tr.run-row td[data-col='{col}']",
                                         "cs => cs.map(c => c.textContent)"))


def test_runs_table_sorts_filters_searches_and_keeps_the_view_in_the_address(
        page: Any, service: ServiceCore, records: list[StepRecord]) -> None:
    from rlmon.service.liveness.run_state import LivenessView, RunState

    actor = [r for r in records if r.role == "actor"]
    # a longer run that failed, with the settings its integration reported; a short one running
    service.publish([replace(r, run="ppo-long", finalized_at=T0 + 1000 + 40 * r.step)
                     for r in actor])
    service.set_run_info("ppo-long", {"framework": "verl", "algorithm": "ppo", "dp": 4})
    started = time.time() - 5
    service.publish([replace(r, run="grpo-short", finalized_at=started + r.step)
                     for r in actor[:5]])
    service.set_run_info("grpo-short", {"framework": "openrlhf", "algorithm": "grpo"})
    now = time.time()
    service.liveness([LivenessView("ppo-long", "actor", RunState.FAILED, now, now, 29,
                                   now, now, 1.0, 60.0, 4),
                      LivenessView("grpo-short", "actor", RunState.RUNNING, now, now, 4,
                                   now, now, 1.0, 60.0, 4)])
    page.goto(page.base)
    page.wait_for_selector("#runs tr.run-row")
    assert sorted(shown_runs(page)) == sorted([RUN, "ppo-long", "grpo-short"])
    # the demo's run once, its three roles beneath it
    assert page.eval_on_selector_all(f"#runs tr.role-row[data-run='{RUN}']",
                                     "rs => rs.map(r => r.dataset.role)") == [
        "actor", "reward", "rollout"]
    # sort by duration, longest first (a second click on the header)
    page.click("#runs th[data-col=duration]")
    page.click("#runs th[data-col=duration]")
    page.wait_for_function("() => location.hash.includes('sort=-duration')")
    # 1160 s, 290 s, and the running one's few seconds until now
    assert shown_runs(page) == ["ppo-long", RUN, "grpo-short"]
    assert cells(page, "duration")[:2] == ["19 min 20 s", "4 min 50 s"]
    assert cells(page, "state") == ["failed", "unknown", "running"]
    # a setting the runs reported, as a column
    page.click("#runs-columns summary")
    page.check("#runs-columns input[data-col='set:algorithm']")
    page.wait_for_selector("#runs th[data-col='set:algorithm']")
    assert cells(page, "set:algorithm") == ["ppo", "", "grpo"]
    assert cells(page, "framework") == ["verl", "not said", "openrlhf"]
    # search, then a state
    page.fill("#runs-search", "grpo")
    page.wait_for_function("() => document.querySelectorAll('#runs tr.run-row').length === 2")
    assert shown_runs(page) == [RUN, "grpo-short"]
    page.select_option("#runs-state", "running")
    page.wait_for_function("() => document.querySelectorAll('#runs tr.run-row').length === 1")
    assert shown_runs(page) == ["grpo-short"]
    assert page.inner_text("#runs-count") == "1 of 3 runs"
    # the address restores the whole view in another tab; a poll keeps it
    shared = page.url
    assert all(p in shared for p in ("sort=-duration", "q=grpo", "state=running",
                                     "set%3Aalgorithm"))
    other = page.context.new_page()
    other.goto(shared)
    other.wait_for_selector("#runs th[data-col='set:algorithm']")
    assert shown_runs(other) == ["grpo-short"]
    assert other.input_value("#runs-search") == "grpo"
    assert other.input_value("#runs-state") == "running"
    other.evaluate("() => { window.notReloaded = true; }")
    service.publish([replace(actor[5], run="grpo-short", finalized_at=started + 5)])
    other.wait_for_function("() => document.querySelector("
                            "\"#runs tr.run-row td[data-col=last_step]\").textContent === '5'")
    assert shown_runs(other) == ["grpo-short"] and other.evaluate("() => window.notReloaded")
    other.close()
    page.goto(page.base + "#/?sort=run")
    page.wait_for_function("() => document.querySelectorAll('#runs tr.run-row').length === 3")
    assert shown_runs(page) == sorted([RUN, "ppo-long", "grpo-short"])
    assert page.input_value("#runs-search") == ""
    if os.environ.get("RLMON_UPDATE_SCREENSHOT") == "1":
        page.goto(page.base + "#/?sort=-duration&cols=state,start,duration,last_step,gpus,cost,"
                  "alerts,framework,set:algorithm,set:dp")
        page.wait_for_selector("#runs th[data-col='set:dp']")
        page.evaluate("() => { document.getElementById('runs-columns').open = true; }")
        page.screenshot(path=str(DOCS / "runs-table.png"), clip={
            "x": 0, "y": 0, "width": 1400, "height": 520})
