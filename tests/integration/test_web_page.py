"""The run page in a real browser: Debian's headless Chromium, driven by Playwright, loads the page
from a service fed the bundled example run (the demo's GRPO run) and is checked by what it
renders: the runs table, the points each panel draws, the alert markers on the canvas, the alert
page's worst samples and timeline, a step published while the page is open, and a screenshot
that is not blank. With RLMON_UPDATE_SCREENSHOT=1 the run page's screenshot is written to
docs/run-page.png.
"""

from __future__ import annotations

import io
import json
import os
import time
import urllib.parse
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlmon.service.contract.step_record import StepRecord
from rlmon.service.service_core import ServiceCore
from tests.support.web_support import example_records, fed_service

pytestmark = pytest.mark.integration

RUN = "grpo-demo-0"
DOCS_SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "run-page.png"


@pytest.fixture
def records() -> list[StepRecord]:
    return example_records()


def panels(tab: Any) -> list[dict[str, Any]]:
    return list(tab.eval_on_selector_all("#panels .panel", """els => els.map(e => ({
        title: e.dataset.title, metrics: e.dataset.metrics.split(","),
        points: Number(e.dataset.points), series: e.dataset.seriesPoints,
        onsets: e.dataset.onsets, resolves: e.dataset.resolves}))"""))


def api(service: ServiceCore, path: str) -> Any:
    import json
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{service.port}{path}", timeout=10) as resp:
        return json.loads(resp.read())


def pixels(png: bytes) -> np.ndarray:
    from matplotlib import image

    return np.asarray(image.imread(io.BytesIO(png), format="png"))


def test_runs_table_lists_the_run_once_with_its_roles_beneath(page: Any,
                                                              service: ServiceCore) -> None:
    from rlmon.service.liveness.run_state import LivenessView, RunState

    now = time.time()
    service.liveness([LivenessView(RUN, "rollout", RunState.STALLED, now - 300, now, 29,
                                   now - 300, now - 300, 1.0, 60.0, 1)])
    page.goto(page.base)
    page.wait_for_selector("#runs tbody tr")
    runs = page.eval_on_selector_all("#runs tr.run-row", """rows => rows.map(r => [
        r.dataset.run, r.querySelector('[data-col=state]').textContent,
        r.querySelector('[data-col=last_step]').textContent,
        r.querySelector('[data-col=gpus]').textContent])""")
    assert runs == [[RUN, "stalled", "29", "6"]]  # once, as bad as its worst role
    rows = page.eval_on_selector_all("#runs tr.role-row", """rows => rows.map(r => [
        r.dataset.run, r.dataset.role, r.querySelector('[data-col=state]').textContent,
        r.querySelector('.last-step').textContent,
        r.querySelector('[data-col=gpus]').textContent,
        r.querySelector('[data-col=alerts]').textContent])""")
    assert rows == [
        [RUN, "actor", "unknown", "29", "4 / 4 ranks", "ISRatioStaleLogprobMismatch"],
        [RUN, "reward", "unknown", "29", "1 / 1 ranks", "none"],
        [RUN, "rollout", "stalled", "29", "1 / 1 ranks", "PolicyLagGrowingRunStalled"],  # it pages
    ]
    page.click("#runs tr[data-role=rollout] a:text('RunStalled')")
    page.wait_for_selector("dl.facts")
    text = page.inner_text("main")
    assert "Look first at the ranks" in text and "stalled since" in text


def test_run_page_draws_every_point_and_the_alert_onsets(page: Any, service: ServiceCore) -> None:
    page.goto(page.base)
    page.click("#runs tr[data-role=actor] a[href^='#/run/']")
    page.wait_for_selector("#panels .panel[data-onsets]")
    expected = api(service, f"/api/curves?run={RUN}&role=actor")
    shown = panels(page)
    assert [p["title"] for p in shown] == [p["title"] for p in expected["panels"]]
    for drawn, want in zip(shown, expected["panels"], strict=True):
        assert drawn["points"] == len(want["x"]) == 30
        assert drawn["series"] == ",".join(
            str(sum(v is not None for v in ys)) for ys in want["y"])
        # LogprobMismatch, ISRatioStale, LogprobMismatch escalated to critical: in every panel
        assert drawn["onsets"] == "7,12,14"
    # the markers are on the canvas, at the onset steps' pixels, in the warning colour
    found = page.evaluate("""() => {
        const u = window.rlmonCharts()[0];
        const ctx = u.ctx, out = {};
        for (const step of [7, 12, 20]) {
            const x = Math.round(u.valToPos(step, 'x', true));
            let hits = 0;
            for (let y = u.bbox.top; y < u.bbox.top + u.bbox.height; y += 2) {
                const [r, g, b] = ctx.getImageData(x, y, 1, 1).data;
                if (r > 200 && g > 100 && g < 170 && b < 60) hits++;
            }
            out[step] = hits;
        }
        return out;
    }""")
    assert found["7"] > 10 and found["12"] > 10 and found["20"] == 0


def test_zoom_and_role_tabs(page: Any) -> None:
    page.goto(page.base + f"#/run/{RUN}?role=actor")
    page.wait_for_selector("#panels .panel[data-points]")
    page.fill("#zoom-from", "5")
    page.fill("#zoom-to", "15")
    page.click("#zoom-apply")
    page.wait_for_function("() => document.querySelector('#panels .panel')?.dataset.points === '11'")
    assert {p["points"] for p in panels(page)} == {11}
    assert {p["onsets"] for p in panels(page)} == {"7,12,14"}
    page.click(".tabs a:text('rollout')")
    page.wait_for_function("() => [...document.querySelectorAll('#panels .panel')].some("
                           "p => p.dataset.metrics === 'rollout/policy_lag')")
    lag = next(p for p in panels(page) if p["metrics"] == ["rollout/policy_lag"])
    assert lag["points"] == 30 and lag["onsets"] == "25"


def test_alert_page_lists_the_worst_samples_and_the_timeline(page: Any,
                                                            service: ServiceCore) -> None:
    page.goto(page.base)
    page.click("#runs tr[data-role=actor] a:text('ISRatioStale')")
    page.wait_for_selector("#samples tr.sample")
    stored = service.history.samples(RUN, "actor", 12, "actor/is_ratio_lowest")[0]
    rows = page.eval_on_selector_all("#samples tr.sample", """rows => rows.map(r =>
        [r.cells[3].textContent, r.cells[4].textContent])""")
    assert rows == [[ident, payload] for _score, ident, payload in stored.items]
    text = page.inner_text("main")
    assert "actor/is_ratio_min < 0.1" in text and "Some tokens come from a stale policy" in text
    assert page.eval_on_selector_all("#timeline rect.rank-step", "r => r.length") == 4
    names = set(page.eval_on_selector_all("#timeline rect.span", "r => r.map(e => e.dataset.name)"))
    assert names == {"generate", "train", "backward"}
    href = page.get_attribute("#perfetto", "href")
    with page.expect_download() as download:
        page.click("#perfetto")
    assert b"backward" in Path(download.value.path()).read_bytes()
    assert href.startswith("api/trace?")
    assert page.get_attribute("#around", "data-onsets") == "12"


def test_an_alert_still_firing_when_its_run_ended_is_not_drawn_or_called_resolved(
        page: Any, service: ServiceCore) -> None:
    """The run finished with ISRatioStale and LogprobMismatch (escalated) firing: the service
    closes them, but the alert page says they were still firing when the run ended, and the
    run page draws no resolve at its last step."""
    from rlmon.service.liveness.run_state import LivenessView, RunState

    now = time.time()
    closed = service.liveness([LivenessView(RUN, "actor", RunState.FINISHED, now, now, 29,
                                            now, now, 1.0, 60.0, 4)])
    assert {(e.alert, e.state, e.ended_with_run) for e in closed} >= {
        ("ISRatioStale", "resolved", True), ("LogprobMismatch", "resolved", True)}
    page.goto(page.base + f"#/alert/{RUN}/actor/ISRatioStale/12")
    page.wait_for_selector("#alert-state")
    assert page.inner_text("#alert-state") == \
        "fired at step 12, still firing when the run ended at step 29"
    assert page.get_attribute("#around", "data-resolves") == ""
    page.goto(page.base + f"#/alert/{RUN}/actor/LogprobMismatch/7")
    page.wait_for_function("() => document.querySelector('#alert-state')?.textContent"
                           ".startsWith('fired at step 7')")
    assert page.inner_text("#alert-state") == \
        "fired at step 7, still firing when the run ended at step 29"
    assert page.inner_text("#alert-severity") == "critical"
    page.goto(page.base + f"#/run/{RUN}?role=actor")
    page.wait_for_selector("#panels .panel[data-onsets]")
    assert {p["resolves"] for p in panels(page)} == {""}
    assert {p["onsets"] for p in panels(page)} == {"7,12,14"}


def test_an_early_warning_handed_over_to_its_level_rule_is_not_drawn_or_called_resolved(
        page: Any, service: ServiceCore, records: list[StepRecord]) -> None:
    """The entropy collapses: EntropySliding fires, then EntropyCollapse, which judges that
    level, takes over. The warning's closing is no recovery: the alert page says to whom it was
    handed over, and neither page draws a resolve for it."""
    template = next(r for r in records if r.role == "actor" and r.step == 29)
    collapsed = {**template.metrics, "actor/entropy": 0.001}
    service.publish([replace(template, step=s, metrics=collapsed) for s in (30, 31, 32)])
    rows = [a for a in service.history.alerts(RUN, cost=True) if a["alert"] == "EntropySliding"]
    (fired,) = [a["step"] for a in rows if a["state"] == "firing"]
    assert [(a["step"], a["handed_to"]) for a in rows if a["state"] == "resolved"] == [
        (32, "EntropyCollapse")]
    page.goto(page.base + f"#/alert/{RUN}/actor/EntropySliding/{fired}")
    page.wait_for_selector("#alert-state")
    assert page.inner_text("#alert-state") == (
        f"fired at step {fired}, handed over to EntropyCollapse at step 32 (its level rule "
        "fires now)")
    page.wait_for_selector("#around[data-resolves]")
    assert page.get_attribute("#around", "data-resolves") == ""
    page.goto(page.base + f"#/run/{RUN}?role=actor")
    page.wait_for_selector("#panels .panel[data-points='33']")
    entropy = next(p for p in panels(page) if p["metrics"] == ["actor/entropy"])
    assert entropy["resolves"] == ""


def test_a_late_answer_does_not_replace_the_page_navigated_to(page: Any) -> None:
    # the service answers concurrently: the first load's /api/runs can come back after a poll's
    # has drawn the runs table and the user has clicked an alert (seen on a loaded machine); the
    # alert page must stay. The first answer is held until the alert page is drawn.
    held: list[Any] = []
    page.route("**/api/runs", lambda route: route.continue_() if held else held.append(route))
    page.goto(page.base)
    page.click("#runs tr[data-role=actor] a:text('ISRatioStale')")  # drawn by a poll
    page.wait_for_selector("#samples tr.sample")
    assert len(held) == 1
    # the first load ends with the status "live" (a poll's says "live, updated ..."): seen once
    # the held answer has been handled
    page.evaluate("""() => { const status = document.getElementById('status');
        new MutationObserver((changes) => {
            if (changes.some(c => [...c.addedNodes].some(n => n.textContent === 'live'))) {
                window.firstLoadDone = true;
            }
        }).observe(status, { childList: true }); }""")
    held[0].continue_()
    page.wait_for_function("() => window.firstLoadDone === true")
    assert page.url.endswith(f"#/alert/{RUN}/actor/ISRatioStale/12")
    assert page.query_selector("#runs") is None
    assert page.eval_on_selector_all("#samples tr.sample", "rows => rows.length") > 0


def test_new_steps_and_alerts_appear_without_a_reload(page: Any, service: ServiceCore,
                                                      records: list[StepRecord]) -> None:
    page.goto(page.base + f"#/run/{RUN}?role=actor")
    page.wait_for_selector("#panels .panel[data-points='30']")
    template = next(r for r in records if r.role == "actor" and r.step == 29)
    page.evaluate("() => { window.notReloaded = true; }")
    # three steps of collapsed entropy fire EntropyCollapse (and the early warning before it)
    collapsed = {**template.metrics, "actor/entropy": 0.001}
    service.publish([replace(template, step=s, metrics=collapsed) for s in (30, 31, 32)])
    page.wait_for_function("() => document.querySelector('#shown').dataset.lastStep === '32'")
    page.wait_for_function("() => [...document.querySelectorAll('#panels .panel')].every("
                           "p => p.dataset.points === '33')")
    entropy = next(p for p in panels(page) if p["metrics"] == ["actor/entropy"])
    fired = sorted({a["step"] for a in service.history.alerts(RUN)
                    if a["role"] == "actor" and a["state"] == "firing"})
    assert 32 in fired and entropy["onsets"] == ",".join(map(str, fired))
    assert "EntropyCollapse at step 32" in page.inner_text("#alert-list")
    assert page.evaluate("() => window.notReloaded") is True
    page.goto(page.base)
    page.wait_for_selector("#runs tr[data-role=actor]")
    service.publish([replace(template, step=33)])
    page.wait_for_function("() => document.querySelector('#runs tr[data-role=actor] .last-step')"
                           ".textContent === '33'")


def test_a_poll_redraws_what_changed_and_keeps_the_links_a_user_may_be_pressing(
        page: Any, service: ServiceCore, records: list[StepRecord]) -> None:
    """The runs table and the run page's alert list are redrawn at every poll (every 250 ms
    here). A redraw that replaced them whole dropped a click whose press and release straddled
    it: the user's click, or Playwright's on a busy machine (the run page never opened). What
    did not change stays the same element; what changed is drawn."""
    page.goto(page.base)
    link = page.wait_for_selector("#runs tr[data-role=actor] a[href^='#/run/']")
    rollout = page.wait_for_selector("#runs tr[data-role=rollout] .last-step")

    def polls(count: int) -> None:
        for _ in range(count):  # each poll draws before the next is asked for
            with page.expect_response(lambda r: "/api/runs" in r.url):
                pass

    polls(3)
    assert link.evaluate("a => a.isConnected") and rollout.evaluate("s => s.isConnected")
    template = next(r for r in records if r.role == "actor" and r.step == 29)
    service.publish([replace(template, step=30)])
    page.wait_for_function("() => document.querySelector('#runs tr[data-role=actor] .last-step')"
                           ".textContent === '30'")
    polls(2)
    assert link.evaluate("a => a.isConnected")  # the actor's name cell did not change
    assert rollout.evaluate("s => s.isConnected && s.textContent") == "29"
    link.click()
    page.wait_for_selector("#panels .panel[data-onsets]")
    badges = page.wait_for_selector("#alert-list a")
    service.publish([replace(template, step=31)])  # a new step redraws the alert list
    page.wait_for_function("() => document.querySelector('#shown').dataset.lastStep === '31'")
    assert badges.evaluate("a => a.isConnected")


def test_screenshot_of_the_run_page_is_not_blank(page: Any, tmp_path: Path) -> None:
    page.goto(page.base + f"#/run/{RUN}?role=actor")
    page.wait_for_selector("#panels .panel[data-onsets]")
    png = page.screenshot(full_page=True)
    image = pixels(png)[..., :3]
    assert image.shape[0] > 900 and image.shape[1] == 1400
    assert image.std() > 0.05  # mostly white with curves, axes and text
    colours = {tuple(c) for c in (image[::7, ::7] * 255).astype(int).reshape(-1, 3)}
    assert len(colours) > 50
    (tmp_path / "run-page.png").write_bytes(png)
    if os.environ.get("RLMON_UPDATE_SCREENSHOT") == "1":
        DOCS_SCREENSHOT.write_bytes(png)


def test_nan_and_inf_values_are_marked_and_counted(page: Any, service: ServiceCore,
                                                   records: list[StepRecord]) -> None:
    template = next(r for r in records if r.role == "actor" and r.step == 29)
    service.publish([replace(template, step=s, metrics={**template.metrics, "actor/kl": v})
                     for s, v in ((30, float("nan")), (31, float("inf")))])
    page.goto(page.base + f"#/run/{RUN}?role=actor")
    page.wait_for_selector("#panels .panel[data-metrics='actor/kl'][data-nonfinite]")
    kl = "#panels .panel[data-metrics='actor/kl']"

    def shown() -> dict[str, Any]:
        return dict(page.eval_on_selector(kl, """p => ({marked: p.dataset.nonfinite,
            counts: p.dataset.nonfiniteCounts, series: p.dataset.seriesPoints,
            legend: [...p.querySelectorAll('.u-legend .u-series')].filter(
                r => r.style.display !== 'none').map(
                r => r.querySelector('.u-label').textContent)})"""))

    assert shown() == {"marked": "30,31", "counts": "2", "series": "30",  # gaps: 32 steps
                       "legend": ["step", "actor/kl (2 NaN/Inf)"]}
    # the other panels have none: no marker, no count in their legends
    others = page.eval_on_selector_all(
        "#panels .panel:not([data-metrics='actor/kl'])",
        "ps => ps.map(p => [p.dataset.nonfinite, p.dataset.nonfiniteCounts])")
    assert others and all(marked == "" and set(counts.split(",")) == {"0"}
                          for marked, counts in others)

    def marker_pixels(steps: list[int]) -> dict[str, int]:
        # the triangles are on the canvas, at the steps' pixels along the top edge
        return dict(page.evaluate("""([sel, steps]) => {
            const u = window.rlmonCharts().find(c => c.rlmon.panelEl.matches(sel));
            const ctx = u.ctx, out = {};
            for (const step of steps) {
                const x = Math.round(u.valToPos(step, 'x', true));
                let hits = 0;
                for (let y = u.bbox.top; y < u.bbox.top + 8 * devicePixelRatio; y++) {
                    const [r, g, b] = ctx.getImageData(x, y, 1, 1).data;
                    if (r > 150 && r < 200 && g < 40 && b > 150 && b < 200) hits++;
                }
                out[step] = hits;
            }
            return out;
        }""", [kl, steps]))

    found = marker_pixels([20, 30, 31])
    assert found["30"] > 3 and found["31"] > 3 and found["20"] == 0
    # a new step with a NaN appears live: marked, and counted in the legend
    service.publish([replace(template, step=32,
                             metrics={**template.metrics, "actor/kl": float("-inf")})])
    page.wait_for_function(f"() => document.querySelector(\"{kl}\").dataset.nonfinite "
                           "=== '30,31,32'")
    assert shown()["legend"] == ["step", "actor/kl (3 NaN/Inf)"]
    assert marker_pixels([32])["32"] > 3
    # the alert they fired: its values around the onset are marked the same way
    page.goto(page.base + f"#/alert/{RUN}/actor/NonFiniteMetric/30")
    page.wait_for_selector("#around[data-nonfinite]")
    assert page.get_attribute("#around", "data-nonfinite") == "30,31,32"
    assert "actor/kl (3 NaN/Inf)" in page.inner_text("#around .u-legend")
    # and its value at the onset is named as the report and the notifications name it, not "n/a"
    value = page.evaluate("""() => [...document.querySelectorAll('dl.facts dt')].find(
        dt => dt.textContent === 'value at onset').nextElementSibling.textContent""")
    assert value == "NaN"


def test_a_token_is_traded_for_a_key_that_another_port_never_receives(
        chromium: Any, tmp_path: Path, records: list[StepRecord]) -> None:
    """Cookies ignore ports, so none is set: the page keeps the key derived from the token in
    its origin's storage (scheme, host, port) and sends it in the Authorization header. A
    second loopback server, on another port of the same host, is opened in the same browser:
    it receives neither the token, nor the key, nor a cookie, and its pages cannot read it."""
    import http.server
    import threading

    token = "s3cret-token"
    (tmp_path / "token").write_text(token)
    core = fed_service(tmp_path / "state", records, exporter={"token_file": str(tmp_path / "token")})
    seen: list[dict[str, str]] = []

    class Other(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(dict(self.headers))
            body = b"<html><body>another service</body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Other)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    context = chromium.new_context()
    try:
        tab = context.new_page()
        base = f"http://127.0.0.1:{core.port}/"
        tab.goto(base)  # without the token: the page says what it needs
        tab.wait_for_selector("p.error")
        assert "needs the token" in tab.inner_text("p.error")
        requests: list[dict[str, str]] = []
        tab.on("request", lambda r: requests.append(r.headers) if "/api/" in r.url else None)
        tab.goto(base + f"#token={token}")
        tab.wait_for_selector("#runs tbody tr")
        assert tab.url == base + "#/"  # the token is dropped from the address
        key = tab.evaluate("() => localStorage.getItem('rlmon.key')")
        assert key == _key_of(core, token) and token not in key
        assert context.cookies() == []
        assert any(h.get("authorization") == f"Bearer {key}" for h in requests)
        tab.reload()  # the key is kept: no token needed again
        tab.wait_for_selector("#runs tbody tr")
        tab.goto(f"http://127.0.0.1:{other.server_address[1]}/")
        tab.wait_for_selector("text=another service")
        assert tab.evaluate("() => localStorage.getItem('rlmon.key')") is None
        assert seen and all("Cookie" not in h and "Authorization" not in h for h in seen)
        assert not any(token in v or key in v for h in seen for v in h.values())
    finally:
        context.close()
        other.shutdown()
        core.close(0.0)


def _key_of(core: ServiceCore, token: str) -> str:
    """The page key this start of the service hands out for ``token``."""
    import urllib.request

    request = urllib.request.Request(f"http://127.0.0.1:{core.port}/api/key",
                                     headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10) as resp:
        return str(json.loads(resp.read())["key"])


@pytest.mark.parametrize("where", ["?token=", "#token="])
def test_a_token_with_every_character_the_docs_allow_opens_the_page(
        chromium: Any, tmp_path: Path, records: list[StepRecord], where: str) -> None:
    """Issue 40, E16: a token may hold letters, digits and -._~+/ then = (RFC 6750); given in the
    address as typed (a query string reads + as a space in form encoding, which a token never
    holds), or %-escaped, it is traded for the key whole."""
    token = "a+b/c-d.e_f~g+h=="
    (tmp_path / "token").write_text(token)
    core = fed_service(tmp_path / "state", records, exporter={"token_file": str(tmp_path / "token")})
    context = chromium.new_context()
    try:
        base = f"http://127.0.0.1:{core.port}/"
        for given in (token, urllib.parse.quote(token, safe="")):
            tab = context.new_page()
            tab.goto(base + where + given)
            tab.wait_for_selector("#runs tbody tr")
            assert token not in tab.url and "token" not in tab.url
            key = tab.evaluate("() => localStorage.getItem('rlmon.key')")
            assert key == _key_of(core, token)
            tab.evaluate("() => localStorage.clear()")
            tab.close()
    finally:
        context.close()
        core.close(0.0)


def test_careless_addresses_are_handled(page: Any, service: ServiceCore,
                                        records: list[StepRecord]) -> None:
    """?poll= out of bounds or not a number polls at a sane rate; a malformed %-escape in the
    address is an error on the page, not an uncaught URIError; the alert page's timeline draws
    each span after its parent (a child listed first is not hidden under its parent's bar)."""
    base = page.base.replace("?poll=250", "")
    for asked, used in (("abc", 2000), ("3000000000", 60000), ("0", 200), ("-5", 200),
                        ("750", 750)):
        page.goto(base + f"?poll={asked}")
        page.wait_for_selector("#runs tbody tr")
        assert page.evaluate("() => window.rlmonPollMs") == used, asked
    page.goto(base + "#/run/%E0%A4%A")
    page.wait_for_selector("p.error")
    assert "not well formed" in page.inner_text("p.error")
    # a timeline whose child span comes first in the record
    from rlmon.service.contract.timeline import Span

    template = next(r for r in records if r.role == "actor" and r.step == 12)
    timelines = tuple(replace(t, timeline=replace(t.timeline, spans=tuple(sorted(
        t.timeline.spans, key=lambda s: -s.depth)))) for t in template.timelines)
    assert isinstance(timelines[0].timeline.spans[0], Span) and timelines[0].timeline.spans[0].depth == 1
    service.history.add([replace(template, timelines=timelines)], [], states={})
    page.goto(page.base + f"#/alert/{RUN}/actor/ISRatioStale/12")
    page.wait_for_selector("#timeline rect.span")
    depths = page.eval_on_selector_all("#timeline rect.span", "r => r.map(e => Number(e.dataset.depth))")
    per_rank = [depths[i:i + 3] for i in range(0, len(depths), 3)]
    assert len(per_rank) == 4 and all(d == [0, 0, 1] for d in per_rank)
    names = page.eval_on_selector_all("#timeline rect.span", "r => r.map(e => e.dataset.name)")
    assert names[2::3] == ["backward"] * 4  # the child last in each rank, over its parent


def test_a_metric_picked_by_search_is_drawn_and_the_address_restores_the_view(
        page: Any, service: ServiceCore) -> None:
    page.goto(page.base + f"#/run/{RUN}?role=actor")
    page.wait_for_selector("#panels .panel[data-points]")
    keys = [p["title"] for p in panels(page)]
    page.fill("#metric-search", "straggl")
    page.click(".metric-option[data-metric='perf/straggler_ratio']")
    picked = "#panels .panel[data-picked][data-metrics='perf/straggler_ratio']"
    page.wait_for_selector(picked + "[data-points]")
    want = api(service, f"/api/curves?run={RUN}&role=actor&metrics=perf%2Fstraggler_ratio")
    drawn = panels(page)
    assert drawn[0]["metrics"] == ["perf/straggler_ratio"]
    assert drawn[0]["points"] == len(want["panels"][0]["x"]) == 30
    assert drawn[0]["series"] == str(sum(v is not None for v in want["panels"][0]["y"][0]))
    # the values drawn are the stored ones (uPlot's data), and the key panels stay below
    data = page.evaluate("() => window.rlmonCharts()[0].data")
    assert data == [want["panels"][0]["x"], want["panels"][0]["y"][0]]
    assert [p["title"] for p in drawn[1:]] == keys
    shared = page.url
    assert "m=perf%2Fstraggler_ratio" in shared
    # the address, opened in another tab, restores the view
    other = page.context.new_page()
    other.goto(shared)
    other.wait_for_selector(picked + "[data-points='30']")
    assert other.eval_on_selector_all("#panels .panel", "ps => ps.length") == len(keys) + 1
    assert other.eval_on_selector_all(".chip[data-metric]", "cs => cs.map(c => c.dataset.metric)") \
        == ["perf/straggler_ratio"]
    other.close()


def test_runs_and_attempts_are_overlaid_by_step_each_in_its_colour(
        page: Any, service: ServiceCore, records: list[StepRecord]) -> None:
    actor = [r for r in records if r.role == "actor"]
    # another run: a KL half again as large, and only from step 5; a run with two attempts
    service.publish([replace(r, run="grpo-demo-1", metrics={
        **r.metrics, "actor/kl": 1.5 * r.metrics["actor/kl"]}) for r in actor if r.step >= 5])
    service.publish([replace(r, run="rerun") for r in actor])
    service.publish([replace(r, run="rerun", attempt=1, metrics={
        **r.metrics, "actor/kl": 2 * r.metrics["actor/kl"]}) for r in actor[:12]])
    page.goto(page.base + f"#/run/{RUN}?role=actor")
    page.wait_for_selector("#overlay-run")
    page.fill("#overlay-run", "grpo-demo-1")
    page.click("#overlay-add")
    kl = "#panels .panel[data-metrics='actor/kl']"
    page.wait_for_selector(kl + "[data-overlay-onsets]")
    assert "with=grpo-demo-1" in page.url

    def chart(sel: str) -> dict[str, Any]:
        return dict(page.evaluate("""(sel) => {
            const u = window.rlmonCharts().find(c => c.rlmon.panelEl.matches(sel));
            // the curves after the bands across ranks (each run's, two columns each)
            const k = 1 + u.rlmon.state.offset;
            return { data: [u.data[0], ...u.data.slice(k)],
                     labels: u.series.slice(k).map(s => s.label),
                     strokes: u.series.slice(k).map(s => s._stroke || s.stroke()),
                     bands: u.series.slice(1, k).map(s => s.label),
                     onsets: u.rlmon.panelEl.dataset.onsets,
                     overlay: u.rlmon.panelEl.dataset.overlayOnsets };
        }""", sel))

    shown = chart(kl)
    assert shown["bands"] == [f"{run}: actor/kl ({edge} rank)" for run in (RUN, "grpo-demo-1")
                              for edge in ("lowest", "highest")]
    mine = api(service, f"/api/curves?run={RUN}&role=actor")
    theirs = api(service, "/api/curves?run=grpo-demo-1&role=actor")
    x = shown["data"][0]
    assert x == list(range(30))
    assert shown["labels"] == [f"{RUN}: actor/kl", "grpo-demo-1: actor/kl"]
    assert shown["strokes"][0] != shown["strokes"][1]
    kl_of = {p["metrics"][0]: p for p in mine["panels"]}["actor/kl"]
    assert shown["data"][1] == kl_of["y"][0]
    their_kl = {p["metrics"][0]: p for p in theirs["panels"]}["actor/kl"]
    assert shown["data"][2] == [None] * 5 + their_kl["y"][0]  # aligned by step
    assert theirs["alerts"]
    onsets = sorted({a["step"] for a in theirs["alerts"] if a["state"] == "firing"})
    assert shown["overlay"] == ",".join(f"grpo-demo-1@{s}" for s in onsets)
    assert shown["onsets"] == ",".join(map(str, sorted(
        {a["step"] for a in mine["alerts"] if a["state"] == "firing"})))
    # where the two part ways (rlmon diff's answer), one click away
    from rlmon.service.diff import diff_runs
    from rlmon.service.diff.runs import from_step_lines

    page.click("#diff-link")
    page.wait_for_selector("#diff-headline")
    want = diff_runs(*(from_step_lines(service.history.steps(r), r, "history store")
                       for r in (RUN, "grpo-demo-1")))
    assert page.inner_text("#diff-headline") == want.headline()
    assert page.get_attribute("#diff-headline", "data-metric") == (
        want.first.metric if want.first else "")
    assert want.common_steps == 25 and want.headline().endswith("metrics compared)")
    drawn = page.eval_on_selector_all("#panels .panel", "ps => ps.map(p => p.dataset.title)")
    assert drawn == list(want.curves)
    # the attempts of one run: the latest shown, an earlier one overlaid
    page.goto(page.base + "#/run/rerun?role=actor")
    page.wait_for_selector("#overlay-attempt")
    page.select_option("#overlay-attempt", "0")
    page.wait_for_function("() => location.hash.includes('att=0')")
    page.wait_for_selector(kl + "[data-points='30']")
    shown = chart(kl)
    assert shown["labels"] == ["rerun (attempt 1): actor/kl", "rerun (attempt 0): actor/kl"]
    first = {p["metrics"][0]: p for p in api(
        service, "/api/curves?run=rerun&role=actor&attempt=0")["panels"]}["actor/kl"]["y"][0]
    assert shown["data"][2] == first
    assert shown["data"][1][:12] == [2 * v for v in first[:12]] and shown["data"][1][12:] == [None] * 18
