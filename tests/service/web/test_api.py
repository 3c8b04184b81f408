"""The run page's JSON API (rlmon.service.web), over HTTP against a service fed the example run."""

from __future__ import annotations

import json
import socket
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlmon.cli import main
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.service_core import ServiceCore
from rlmon.service.web.api import PANELS
from rlmon.service.web.curves import downsample
from tests.support.web_support import fed_service, get

RUN = "grpo-demo-0"


def roles_of(body: Any) -> dict[tuple[str, str], Any]:
    return {(r["run"], s["role"]): s for r in body["runs"] for s in r["roles"]}


def test_runs_lists_each_run_once_with_its_roles_beneath(service: ServiceCore) -> None:
    status, body, _ = get(service, "/api/runs")
    assert status == 200
    assert [r["run"] for r in body["runs"]] == [RUN]  # one row, not one per role
    run = body["runs"][0]
    streams = roles_of(body)
    assert list(streams) == [(RUN, role) for role in ("actor", "reward", "rollout")]
    actor = streams[RUN, "actor"]
    assert (actor["first_step"], actor["last_step"], actor["attempt"]) == (0, 29, 0)
    assert (actor["ranks_reporting"], actor["ranks_expected"]) == (4, 4)
    assert {a["alert"]: a["step"] for a in actor["firing"]} == {
        "LogprobMismatch": 7, "ISRatioStale": 12}
    assert actor["state"] == "unknown" and actor["age_seconds"] >= 0.0
    assert body["alerts_seen"] == len(service.history.alerts())
    goodput = {run: g for run, (_s, g, _m) in service.goodput.snapshot().items()}
    assert 0.0 < goodput[RUN] < 1.0 and run["goodput"] == goodput[RUN]
    # the run: its roles' span, every role's firing alerts, its ranks' GPUs (one per rank by
    # default) and what they cost over its duration
    stored = service.history.read("SELECT MIN(finalized_at), MAX(finalized_at) FROM steps")[0]
    assert (run["start"], run["last_time"]) == stored
    assert run["duration_seconds"] == pytest.approx(stored[1] - stored[0])  # ended: not "now"
    assert (run["first_step"], run["last_step"], run["state"]) == (0, 29, "unknown")
    assert sorted(a["alert"] for a in run["firing"]) == [
        "ISRatioStale", "LogprobMismatch", "PolicyLagGrowing"]
    assert {a["role"] for a in run["firing"]} == {"actor", "rollout"}
    assert run["gpus"] == 6.0 == service.goodput.run_gpus(RUN)
    assert run["gpu_hours"] == pytest.approx(6.0 * run["duration_seconds"] / 3600)
    assert run["money"] is None and body["price"] is None
    assert run["framework"] == "" and run["settings"] == {} and body["settings"] == []


def test_runs_carry_the_settings_a_run_reported_and_its_price(
        tmp_path: Path, records: list[StepRecord]) -> None:
    core = fed_service(tmp_path, records, goodput={"price_per_gpu_hour": 2.5,
                                                   "currency": "EUR"})
    try:
        core.set_run_info(RUN, {"framework": "openrlhf", "algorithm": "grpo", "dp": 4,
                                "zero_stage": 3})
        _, body, _ = get(core, "/api/runs")
    finally:
        core.close(0.0)
    run = body["runs"][0]
    assert run["framework"] == "openrlhf"
    # what the run said; the fields it left at their defaults (dpo false, blanks) are not shown
    assert run["settings"] == {"algorithm": "grpo", "dp": "4", "zero_stage": "3"}
    assert body["settings"] == ["algorithm", "dp", "zero_stage"]
    assert body["price"] == {"per_gpu_hour": 2.5, "currency": "EUR"}
    assert run["money"] == pytest.approx(2.5 * run["gpu_hours"])


def test_a_runs_settings_and_tags_outlive_a_service_restart(
        tmp_path: Path, records: list[StepRecord]) -> None:
    """What a run said of itself is kept with its steps: a restarted service (its memory empty
    until the run speaks again, which a finished run never does) still shows it."""
    from rlmon.service.config import load_config

    core = fed_service(tmp_path, records)
    core.set_run_info(RUN, {"framework": "verl", "algorithm": "grpo", "dp": 4,
                            "tags": ["baseline", "7b"]})
    core.close(0.0)
    again = ServiceCore(load_config(None), state_dir=tmp_path, port=0, host="127.0.0.1").start()
    try:
        assert again.spine.memory.run_info == {}  # nothing said since the restart
        _, body, _ = get(again, "/api/runs")
    finally:
        again.close(0.0)
    (run,) = body["runs"]
    assert run["framework"] == "verl" and run["tags"] == ["baseline", "7b"]
    assert run["settings"] == {"algorithm": "grpo", "dp": "4"}


def test_runs_show_the_liveness_state_the_service_keeps(service: ServiceCore) -> None:
    from rlmon.service.liveness.run_state import LivenessView, RunState

    now = time.time()
    service.liveness([LivenessView(RUN, "actor", RunState.STALLED, now - 300, now, 29,
                                   now - 300, now - 300, 1.0, 60.0, 4)])
    _, body, _ = get(service, "/api/runs")
    states = {role: s["state"] for (_, role), s in roles_of(body).items()}
    assert states == {"actor": "stalled", "reward": "unknown", "rollout": "unknown"}
    assert body["runs"][0]["state"] == "stalled"
    # a stalled run still holds its GPUs: its duration runs until now
    assert body["runs"][0]["duration_seconds"] == pytest.approx(
        body["now"] - body["runs"][0]["start"])
    assert body["states_known"] is True
    # the page of the time-based alert it fired: what to check, and the run's state
    firing = next(a for r in body["runs"] for a in r["firing"] if a["alert"] == "RunStalled")
    _, alert, _ = get(service, f"/api/alert?run={RUN}&role=actor&alert=RunStalled"
                               f"&step={firing['step']}")
    assert alert["what_to_check"].startswith("Look first at the ranks")
    assert alert["liveness"]["state"] == "stalled" and alert["around"] is None


def test_runs_show_the_stored_liveness_state_without_the_live_view(
        service: ServiceCore, tmp_path: Path) -> None:
    """After a restart the service's live view is empty; the liveness table it wrote says."""
    from rlmon.service.liveness.run_state import LivenessView, RunState
    from rlmon.service.storage.history import HistoryStore
    from rlmon.service.web.api import WebApi

    now = time.time()
    service.liveness([LivenessView(RUN, "reward", RunState.DEAD, now - 300, now, 29,
                                   now - 300, now - 300, 1.0, 60.0, 1)])
    api = WebApi(HistoryStore(tmp_path / "history.sqlite", read_only=True))
    body = api.runs({})
    states = {role: s["state"] for (_, role), s in roles_of(body).items()}
    assert states == {"actor": "unknown", "reward": "dead", "rollout": "unknown"}
    assert body["runs"][0]["state"] == "dead"
    assert body["runs"][0]["gpus"] is None  # no service to count them: not guessed
    api.store.close()


def test_curves_hold_every_step_of_a_short_run_and_the_alert_transitions(
        service: ServiceCore) -> None:
    status, body, _ = get(service, "/api/curves?run=grpo-demo-0&role=actor")
    assert status == 200
    assert body["roles"] == ["actor", "reward", "rollout"]
    titles = [p["title"] for p in body["panels"]]
    assert titles == [p.title for p in PANELS if set(p.metrics) & {
        "actor/is_ratio", "actor/logp_diff", "actor/kl", "actor/entropy", "actor/clip_ratio",
        "actor/grad_norm", "perf/step_seconds"}]
    lines = service.history.steps("grpo-demo-0", "actor")
    for panel in body["panels"]:
        assert panel["x"] == list(range(30))
        for metric, ys in zip(panel["metrics"], panel["y"], strict=True):
            assert ys == [line["metrics"].get(metric) for line in lines]
    onsets = {(a["alert"], a["step"]) for a in body["alerts"] if a["state"] == "firing"}
    # LogprobMismatch escalates to critical at 14 (docs/alerting.md: escalation)
    assert onsets == {("LogprobMismatch", 7), ("ISRatioStale", 12), ("LogprobMismatch", 14)}


def test_curves_zoom_to_a_step_range(service: ServiceCore) -> None:
    _, body, _ = get(service, "/api/curves?run=grpo-demo-0&role=actor&from=8&to=12")
    assert (body["from"], body["to"], body["shown_steps"]) == (8, 12, 5)
    assert all(p["x"] == [8, 9, 10, 11, 12] for p in body["panels"])
    assert [a["step"] for a in body["alerts"]] == [12]


def test_a_role_without_key_metrics_gets_a_panel_per_metric(service: ServiceCore) -> None:
    _, body, _ = get(service, "/api/curves?run=grpo-demo-0&role=reward")
    names = {m for p in body["panels"] for m in p["metrics"]}
    last = service.history.steps("grpo-demo-0", "reward")[-1]["metrics"]
    assert names and names <= set(last)


def test_curves_read_new_and_late_steps_after_the_first_request(
        service: ServiceCore, records: list[StepRecord]) -> None:
    get(service, "/api/curves?run=grpo-demo-0&role=actor")
    template = next(r for r in records if r.role == "actor" and r.step == 29)
    service.publish([replace(template, step=30, metrics={**template.metrics,
                                                          "actor/kl": 9.5})])
    _, body, _ = get(service, "/api/curves?run=grpo-demo-0&role=actor")
    kl = next(p for p in body["panels"] if p["metrics"] == ["actor/kl"])
    assert kl["x"][-1] == 30 and kl["y"][0][-1] == 9.5
    # a step below the cached last one (finalized late) is read too
    service.publish([replace(template, step=40), replace(template, step=35)])
    get(service, "/api/curves?run=grpo-demo-0&role=actor")
    service.publish([replace(template, step=33)])
    _, body, _ = get(service, "/api/curves?run=grpo-demo-0&role=actor")
    assert body["panels"][0]["x"][-4:] == [30, 33, 35, 40]


def test_alerts_are_what_rlmon_alerts_json_prints(
        service: ServiceCore, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for query, flags in (("", []), ("?run=grpo-demo-0&firing=1", ["--run", "grpo-demo-0",
                                                                     "--firing"]),
                         ("?limit=2", ["--limit", "2"])):
        _, body, _ = get(service, "/api/alerts" + query)
        assert main(["alerts", "--json", "--state-dir", str(tmp_path), *flags]) == 0
        assert body == json.loads(capsys.readouterr().out)


def test_an_alert_has_its_condition_values_samples_and_timeline(
        service: ServiceCore) -> None:
    status, a, _ = get(service, "/api/alert?run=grpo-demo-0&role=actor&alert=ISRatioStale")
    assert status == 200
    assert (a["onset"], a["severity"], a["metric"]) == (12, "warning", "actor/is_ratio_min")
    assert a["condition"] == "actor/is_ratio_min < 0.1 for 3 steps"
    assert a["what_to_check"].startswith("Some tokens come from a stale policy")
    assert a["around"]["x"] == list(range(0, 30))
    line = service.history.steps("grpo-demo-0", "actor")[12]
    assert a["around"]["y"][12] == line["metrics"]["actor/is_ratio_min"] == a["value"]
    stored = service.history.samples("grpo-demo-0", "actor", 12, "actor/is_ratio_lowest")
    assert [(s["metric"], len(s["items"])) for s in a["samples"]] == [
        ("actor/is_ratio_lowest", len(stored[0].items))]
    assert a["samples"][0]["items"][0]["id"] == stored[0].items[0][1]
    ranks = a["timeline"]["ranks"]
    assert a["timeline"]["step"] == 12 and len(ranks) == 4
    assert [s[0] for s in ranks[0]["spans"]] == ["generate", "train", "backward"]
    status, trace, head = get(service, a["trace"])
    assert status == 200 and b"generate" in trace and b"backward" in trace
    assert "attachment" in head["Content-Disposition"]


def test_bad_requests_name_the_parameter(service: ServiceCore) -> None:
    assert get(service, "/api/curves")[:2] == (400, {"error": "missing parameter 'run'"})
    status, body, _ = get(service, "/api/curves?run=grpo-demo-0&from=ten")
    assert status == 400 and body["error"] == "from: not an integer: 'ten'"
    status, body, _ = get(service, "/api/curves?run=nosuch")
    assert status == 404 and "nosuch" in body["error"]
    status, body, _ = get(service, "/api/alert?run=grpo-demo-0&role=actor&alert=KLDivergence")
    assert status == 404 and "never fired" in body["error"]
    assert get(service, "/api/nothing")[0] == 404


def test_the_page_and_its_assets_are_served_from_the_package(service: ServiceCore) -> None:
    status, html, head = get(service, "/")
    assert status == 200 and head["Content-Type"].startswith("text/html")
    for asset in (b"static/uPlot.iife.min.js", b"static/app.js", b"static/style.css"):
        assert asset in html
        assert get(service, "/" + asset.decode())[0] == 200
    assert get(service, "/static/../api.py")[0] == 404
    assert get(service, "/static/uPlot.LICENSE.txt")[1].startswith(b"The MIT License")
    assert get(service, "/metrics")[0] == 200


def test_the_api_answers_while_the_alert_path_holds_the_store(service: ServiceCore) -> None:
    """The page reads through its own connection: a writer holding the store's lock (the alert
    path, mid-commit) does not hold it up."""
    with service.history._lock:
        status, body, _ = get(service, "/api/curves?run=grpo-demo-0&role=actor")
    assert status == 200 and body["steps"] == 30


def test_a_token_guards_the_api_but_not_metrics(tmp_path: Path, records: list[StepRecord],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "token").write_text("s3cret\n")
    core = fed_service(tmp_path / "state", records[:3],
                       exporter={"token_file": str(tmp_path / "token")})
    try:
        assert get(core, "/api/runs")[0] == 401
        assert get(core, "/api/runs", {"Authorization": "Bearer wrong"})[0] == 401
        assert get(core, "/api/runs", {"Authorization": "Bearer s3cret"})[0] == 200
        assert get(core, "/metrics")[0] == 200 and get(core, "/healthz")[0] == 200
        # the page's files hold no data: served to anyone, and no cookie is ever set
        status, body, head = get(core, "/?token=s3cret")
        assert status == 200 and b"app.js" in body and "Set-Cookie" not in head
        assert "s3cret" in core.settings.secret_values()
    finally:
        core.close(0.0)


def test_the_token_is_not_read_from_the_config_file(tmp_path: Path) -> None:
    from rlmon.service.config import ConfigError, load_config

    cfg = tmp_path / "c.yaml"
    cfg.write_text("exporter: {token: s3cret}\n")
    with pytest.raises(ConfigError, match=r"exporter\.token: secrets are not read") as info:
        load_config(cfg)
    assert "s3cret" not in str(info.value)


def test_an_asked_port_that_is_taken_is_an_error_naming_it(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(OSError, match=f"the requested port {port} on 127.0.0.1 is taken"):
            ServiceCore(state_dir=tmp_path / "a", port=port, host="127.0.0.1").start()
        fallback = ServiceCore(state_dir=tmp_path / "b", port=port, host="127.0.0.1",
                               port_fallback=True).start()
        try:
            assert fallback.port not in (None, port)
        finally:
            fallback.close(0.0)


def test_warming_reads_the_active_streams_columns_ahead(service: ServiceCore,
                                                         tmp_path: Path) -> None:
    from rlmon.service.storage.history import HistoryStore
    from rlmon.service.web.api import WebApi

    api = WebApi(HistoryStore(tmp_path / "history.sqlite", read_only=True))
    assert api.warm() == 3 and len(api.columns) == 3
    before = len(api.columns)
    _, body, _ = get(service, "/api/curves?run=grpo-demo-0&role=actor")
    assert api.curves({"run": RUN, "role": "actor"})["panels"] == body["panels"]
    assert len(api.columns) == before  # served from what warm() read
    api.store.close()


# --- downsampling ---------------------------------------------------------------------------------

def test_downsampling_keeps_each_buckets_extremes_and_ends() -> None:
    rng = np.random.default_rng(7)
    steps = np.arange(100_000)
    values = rng.normal(size=100_000)
    values[31_337] = 50.0  # a spike
    values[77_777] = -50.0
    values[500:520] = np.nan  # missing steps
    keep = downsample(steps, [values], 800)
    assert len(keep) <= 4 * 800
    assert {0, 99_999, 31_337, 77_777} <= set(keep.tolist())
    kept = values[keep]
    bucket = (steps * 800) // 100_000
    for b in (0, 123, 799):
        inside = np.flatnonzero(bucket == b)
        chosen = [i for i in keep if bucket[i] == b]
        finite = values[inside][np.isfinite(values[inside])]
        assert max(values[chosen]) == finite.max() and min(values[chosen]) == finite.min()
    assert not np.isnan(kept).any()


def test_downsampling_keeps_everything_when_few() -> None:
    steps = np.arange(50)
    assert downsample(steps, [np.sin(steps)], 800).tolist() == list(range(50))
    assert len(downsample(np.arange(3200), [np.zeros(3200)], 800)) == 3200  # 4 per bucket


def test_any_metric_is_answered_by_name_from_packed_rows_or_step_lines(
        service: ServiceCore) -> None:
    names = ["actor/loss", "actor/kl", "perf/straggler_ratio"]  # a key curve between two others
    status, body, _ = get(service, f"/api/curves?run={RUN}&role=actor&metrics="
                          + "%0A".join(n.replace("/", "%2F") for n in names))
    assert status == 200 and [p["metrics"] for p in body["panels"]] == [[n] for n in names]
    for panel in body["panels"]:
        stored = service.history.series(RUN, "actor", panel["metrics"][0])
        assert list(zip(panel["x"], panel["y"][0], strict=True)) == stored
    status, body, _ = get(service, f"/api/metrics?run={RUN}&role=actor")
    assert status == 200 and {"actor/loss", "actor/kl", "perf/straggler_ratio"} <= set(
        body["metrics"]) and body["attempts"] == [0] and body["metrics"] == sorted(body["metrics"])
    too_many = "%0A".join(f"m{i}" for i in range(30))
    status, body, _ = get(service, f"/api/curves?run={RUN}&role=actor&metrics={too_many}")
    assert status == 400 and body["error"].startswith("metrics:")


def test_diff_answers_what_rlmon_diff_finds_for_two_stored_runs(
        service: ServiceCore, records: list[StepRecord]) -> None:
    from rlmon.service.diff import diff_runs
    from rlmon.service.diff.runs import from_step_lines

    # the same run with its entropy collapsing from step 12: it parts ways there
    service.publish([replace(r, run="other", metrics={
        **r.metrics, **({"actor/entropy": r.metrics["actor/entropy"] * 0.05}
                        if r.role == "actor" and r.step >= 12 else {})}) for r in records])
    status, body, _ = get(service, f"/api/diff?a={RUN}&b=other")
    want = diff_runs(*(from_step_lines(service.history.steps(r), r, "history store")
                       for r in (RUN, "other"))).to_json()
    read = body.pop("read")
    assert status == 200 and body == json.loads(json.dumps(want))
    assert read["stride"] == 1 and not read["a"]["cut"] and not read["b"]["cut"]
    entropy = next(m for m in body["metrics"] if m["metric"] == "actor/entropy")
    assert entropy["diverged"] and 12 <= entropy["onset"] <= 16
    status, body, _ = get(service, f"/api/diff?a={RUN}&b=nothing")
    assert status == 404 and body["error"].startswith("b: no steps of run 'nothing'")


def test_curves_give_each_points_time_and_the_step_times_spread_across_ranks(
        service: ServiceCore, records: list[StepRecord]) -> None:
    from tests.support.web_support import with_timeline

    actor = [r for r in records if r.role == "actor"]
    # timelines of 4 ranks at even steps (the last rank 0.3 s slower), of 1 rank at step 1; the
    # steps as stored before the aggregator kept per-rank extremes
    service.publish([replace(with_timeline(r) if r.step % 2 == 0 else with_timeline(r, ranks=1)
                             if r.step == 1 else r, run="timed", finalized_at=1000.0 + 5 * r.step,
                             rank_extremes={})
                     for r in actor])
    _, body, _ = get(service, "/api/curves?run=timed&role=actor")
    assert body["start_time"] == 1000.0
    panels = {p["metrics"][0]: p for p in body["panels"]}
    assert all(p["t"] == [5.0 * s for s in p["x"]] for p in body["panels"])
    spread = panels["perf/step_seconds"]["spread"]
    # an odd step keeps the timeline the fixture gave the alert onsets (step 7)
    timed = [s % 2 == 0 or (s != 1 and len(actor[s].timelines) >= 2) for s in range(30)]
    assert timed.count(True) == 16
    assert spread == [{"min": [1.5 if t else None for t in timed],
                       "max": [pytest.approx(1.8) if t else None for t in timed]}]
    assert panels["actor/kl"]["spread"] == [None]  # no per-rank values stored
    # a zoom: the same, for its steps
    _, zoom, _ = get(service, "/api/curves?run=timed&role=actor&from=10&to=13")
    zoomed = {p["metrics"][0]: p for p in zoom["panels"]}["perf/step_seconds"]
    assert zoomed["t"] == [50.0, 55.0, 60.0, 65.0] and zoom["start_time"] == 1000.0
    assert zoomed["spread"][0]["min"] == [1.5, None, 1.5, None]
    # the extremes the aggregator kept, for every metric the ranks reported; the step time's
    # from its ranks' own values rather than their timelines
    service.publish([replace(with_timeline(r), run="kept") for r in actor])
    _, kept, _ = get(service, "/api/curves?run=kept&role=actor")
    for panel in kept["panels"]:
        for metric, spread in zip(panel["metrics"], panel["spread"], strict=True):
            own = [actor[x].rank_extremes.get(metric) for x in panel["x"]]
            assert spread == (None if own[0] is None else {
                "min": [e[0] for e in own if e], "max": [e[1] for e in own if e]}), metric
    assert {p["metrics"][0]: p for p in kept["panels"]}["actor/kl"]["spread"][0] is not None
