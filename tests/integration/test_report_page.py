"""The run report's HTML opened in a real headless Chromium: every section and plot rendered
(each image decoded to a real size), one image per curve, and not one request beyond the file
itself (the plots are inline)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlmon.service.report.html import render_html
from rlmon.service.report.model import build_report
from rlmon.service.storage.history import HistoryStore
from tests.support.report_scenario import GOODPUT, RUN, report_store
from tests.support.web_support import browser, need_chromium

pytestmark = pytest.mark.integration


def test_the_report_renders_offline_in_chromium(tmp_path: Path) -> None:
    state = report_store(tmp_path / "state")
    store = HistoryStore(state / "history.sqlite")
    try:
        report = build_report(store, RUN, GOODPUT)
    finally:
        store.close()
    page_file = tmp_path / "report.html"
    page_file.write_text(render_html(report), encoding="utf-8")
    with browser(need_chromium()) as chromium:
        context = chromium.new_context(viewport={"width": 1100, "height": 900})
        tab = context.new_page()
        requests: list[str] = []
        errors: list[str] = []
        tab.on("request", lambda r: requests.append(r.url))
        tab.on("pageerror", lambda exc: errors.append(str(exc)))
        tab.goto(page_file.as_uri())
        tab.wait_for_load_state("load")
        headings = tab.eval_on_selector_all("h2", "els => els.map(e => e.textContent)")
        images = tab.eval_on_selector_all(
            "img", "els => els.map(e => [e.closest('figure').className, e.complete, "
            "e.naturalWidth, e.naturalHeight, e.getBoundingClientRect().height])")
        alerts = tab.eval_on_selector_all(
            "#alerts + table tr", "rows => rows.map(r => r.innerText)")
        height = tab.evaluate("document.body.scrollHeight")
        context.close()
    assert not errors
    assert headings == ["Steps and attempts", "Alerts and what they cost",
                        "Goodput: where the GPU-hours went", "Slowest ranks and stages",
                        "Key curves (red: an alert fired; green: it resolved)", "Notes"]
    assert [kind for kind, *_ in images].count("curve") == len(report.curves)
    assert [kind for kind, *_ in images].count("goodput") == 1
    for kind, complete, width, tall, shown in images:
        assert complete and width > 400 and tall > 100 and shown > 100, kind
    assert requests == [page_file.as_uri()]  # nothing fetched beyond the file
    assert len(alerts) == 3 and "ISRatioStale" in alerts[1] and "lasted 3.0 s: 9 GPUs" in alerts[1]
    assert "(to the run's last step)" in alerts[2]
    assert height > 200 * len(images)  # every plot laid out
