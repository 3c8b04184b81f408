"""``rlmon report``: built offline from a history store the service wrote (the synthetic
scenario's steps, an alert with its cost and worst samples, a restart that rolled steps back),
its goodput equal to the accounting of the same timelines, and rendered as text, JSON and one
self-contained HTML file checked for its sections, one image per curve and no external URL."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path

import pytest

from rlmon.cli import main
from rlmon.service.goodput.accounting import account_step
from rlmon.service.goodput.buckets import Bucket, SpanMap
from rlmon.service.metrics import catalog
from rlmon.service.report.html import render_html
from rlmon.service.report.model import build_report
from rlmon.service.report.text import render_text
from rlmon.service.storage.history import HistoryStore
from tests.support.goodput_scenario import step_input
from tests.support.report_scenario import GOODPUT, RUN, WORST, report_store


@pytest.fixture(scope="module")
def store_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return report_store(tmp_path_factory.mktemp("state"))


def _expected() -> dict[Bucket, float]:
    spans = SpanMap()
    out = dict.fromkeys(Bucket, 0.0)
    for attempt, steps in ((0, range(5, 11)), (1, range(9, 12))):
        for n in steps:
            data = replace(step_input(n), attempt=attempt, rolled_back=attempt == 0 and n >= 9)
            for bucket, value in account_step(data, spans).by_bucket().items():
                out[bucket] += value
    return out


def test_report_model(store_path: Path) -> None:
    store = HistoryStore(store_path / "history.sqlite")
    try:
        report = build_report(store, RUN, GOODPUT, now=0.0)
    finally:
        store.close()
    assert {r.role: (r.steps, r.attempts) for r in report.roles} == {
        "actor": (9, 2), "reward": (9, 2), "rollout": (9, 2)}
    assert report.steps_accounted == 9
    want = _expected()
    for bucket in Bucket:
        assert report.goodput[bucket.value] == pytest.approx(want[bucket], abs=1e-6), bucket
    reasons = {(b, why): v for b, why, v in report.goodput_reasons}
    assert reasons[("wasted", "rolled_back")] > 0 and reasons[("wasted", "no_reward_spread")] > 0
    assert report.goodput_ratio == pytest.approx(want[Bucket.PRODUCTIVE] / sum(want.values()))
    alert, again = [a for a in report.alerts if a.alert == "ISRatioStale"]
    assert (alert.role, alert.fired_step, alert.resolved_step) == ("actor", 7, 9)
    # the resolve's cost: the run's 9 GPUs from the start of step 7 to the end of step 9
    assert alert.gpu_hours == pytest.approx(9 * 3 * 1.000003 / 3600)
    assert alert.cost_note.startswith("lasted 3.0 s: 9 GPUs")
    assert alert.samples_metric == WORST and alert.samples[0]["id"] == "seq-7"
    # still firing at the end: its cost so far runs to the end of the run's last step
    assert (again.attempt, again.fired_step, again.resolved_step) == (1, 11, None)
    assert again.gpu_hours == pytest.approx(9 * 1.000003 / 3600)
    assert again.cost_note.endswith("(to the run's last step)")
    assert {(c.role, c.metric) for c in report.curves} >= {
        ("actor", catalog.IS_RATIO), ("reward", catalog.REWARD), ("actor", catalog.IS_RATIO_MIN)}
    stale = next(c for c in report.curves if c.metric == catalog.IS_RATIO_MIN)
    assert [s for s, _ in stale.points] == [9, 10, 11]  # the latest attempt's curve
    slowest = {(r["role"], r["rank"]["dp"]): r["times_slowest"] for r in report.slowest_ranks}
    assert slowest == {("actor", 3): 9, ("rollout", 0): 9}  # the straggler, the slower engine
    assert report.slowest_stages[0]["span"] in {"train", "generate"}
    assert "my_thing" in report.unmapped_spans
    assert not any("GPUs per rank" in n for n in report.notes)
    text = json.dumps(report.to_json(), allow_nan=False)
    assert [a["alert"] for a in json.loads(text)["alerts"]] == ["ISRatioStale"] * 2
    rendered = render_text(report)
    for heading in ("Steps", "Goodput", "Alerts (2)", "Slowest ranks", "Slowest stages",
                    "Curves"):
        assert heading in rendered
    assert "lasted 3.0 s: 9 GPUs" in rendered and "wasted/rolled_back" in rendered


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: list[str] = []
        self.figures: list[str] = []
        self.images: list[str] = []
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("id"):
            self.ids.append(str(a["id"]))
        if tag == "figure":
            self.figures.append(str(a.get("class")))
        if tag == "img":
            self.images.append(str(a.get("src")))
        for key in ("href", "src"):
            if a.get(key) and not str(a[key]).startswith("data:"):
                self.links.append(str(a[key]))


def test_html_is_one_self_contained_file(store_path: Path, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report.html"
    code = main(["report", RUN, "--state-dir", str(store_path), "--html", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "Goodput" in printed and f"report written to {out}" in printed
    page_text = out.read_text(encoding="utf-8")
    page = _Page()
    page.feed(page_text)
    assert page.ids == ["steps", "alerts", "goodput", "slowest", "curves", "notes"]
    store = HistoryStore(store_path / "history.sqlite")
    try:
        curves = build_report(store, RUN).curves
    finally:
        store.close()
    assert page.figures.count("curve") == len(curves) and page.figures.count("goodput") == 1
    assert all(src.startswith("data:image/png;base64,") for src in page.images)
    assert page.links == [] and "http://" not in page_text and "https://" not in page_text
    assert "ISRatioStale" in page_text and "seq-7" in page_text and "rolled_back" in page_text


def test_json_and_missing_run(store_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", RUN, "--state-dir", str(store_path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["run"] == RUN and not math.isnan(data["goodput_ratio"])
    assert main(["report", "nope", "--state-dir", str(store_path)]) == 1
    assert "no run 'nope'" in capsys.readouterr().err


def test_render_html_entry_point_on_an_empty_run() -> None:
    store = HistoryStore()
    try:
        report = build_report(store, "empty")
    finally:
        store.close()
    page = render_html(report)
    assert "No alert fired" in page and "no goodput" in page


def test_the_run_state_is_the_state_at_the_end(store_path: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "history.sqlite"
    shutil.copy(store_path / "history.sqlite", copy)
    store = HistoryStore(copy)
    try:
        # the service stored "running" at step 2 and saw no end: not shown as the state at step 11
        store.set_liveness([(RUN, "actor", "running", 100.0, 2, 100.0, "")])
        (state,) = build_report(store, RUN, GOODPUT, now=0.0).run_states
        assert (state["state"], state["last_step"]) == ("running", 11)
        assert state["detail"] == "no end recorded: the service last judged it running at step 2"
        how = "Finished at step 11: its driver ended normally"
        store.set_liveness([(RUN, "actor", "finished", 200.0, 11, 200.0, how)])
        report = build_report(store, RUN, GOODPUT, now=0.0)
    finally:
        store.close()
    (state,) = report.run_states
    assert (state["state"], state["last_step"], state["detail"]) == ("finished", 11, how)
    assert f"actor      finished, last step 11: {how}" in render_text(report)


def test_an_alert_closed_because_the_run_ended_is_not_reported_resolved(
        store_path: Path, tmp_path: Path) -> None:
    """A finished run's alerts are closed with it (rlmon.service.alerting.run_end): the report
    says it was still firing when the run ended, draws no resolve for it, and counts it so."""
    import shutil

    from rlmon.service.alerting.alert_types import AlertEvent

    copy = tmp_path / "history.sqlite"
    shutil.copy(store_path / "history.sqlite", copy)
    store = HistoryStore(copy)
    try:
        fired = AlertEvent(run=RUN, role="actor", step=10, alert="KLDivergence",
                           severity="warning", state="firing", metric="actor/kl", value=2.5,
                           attempt=1)
        closed = replace(fired, step=11, state="resolved", value=None, ended_with_run=True)
        store.add([], [fired, closed])
        report = build_report(store, RUN, GOODPUT, now=0.0)
    finally:
        store.close()
    (entry,) = [a for a in report.alerts if a.alert == "KLDivergence"]
    assert (entry.fired_step, entry.resolved_step, entry.ended_with_run) == (10, 11, True)
    assert "KLDivergence [warning] actor step 10 (actor/kl = 2.5), still firing when the run " \
           "ended at step 11" in render_text(report)
    page = render_html(report)
    assert "firing when the run ended at step 11" in page and "1 firing when the run ended" in page
    assert all((11, "KLDivergence", "resolved") not in c.markers for c in report.curves)
