"""Goodput and alert cost through the service: the steps of every role joined and accounted once
the run is past them, exported as counters equal to the pure accounting, and every alert
transition (notification body, history row) saying what its condition has cost since onset."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlmon.service.alerting.engine import AlertEvent
from rlmon.service.alerting.notify.render import (
    pagerduty_body,
    slack_body,
    summary_line,
    webhook_body,
)
from rlmon.service.alerting.rules import default_rules
from rlmon.service.config import GoodputConfig, Settings
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.export.series import ALERT_COST, GOODPUT_RATIO, GOODPUT_SECONDS, MFU
from rlmon.service.goodput.accounting import account_step
from rlmon.service.goodput.buckets import Bucket, SpanMap
from rlmon.service.goodput.cost import Price, alert_cost
from rlmon.service.goodput.ledger import GoodputLedger
from rlmon.service.metrics import catalog
from rlmon.service.service_core import ServiceCore
from tests.support.goodput_scenario import CLIPPED, FRAC_ZERO_STD, step_input
from tests.support.polling import wait_for
from tests.support.records import step_record
from tests.support.scrape import scrape

STEP_NS = 1_000_003_000


def records(step: int, *, skipped: float = 0.0) -> list[StepRecord]:
    """The scenario's step as the aggregator finalizes it: one record per role."""
    data = step_input(step)
    end = max(t.timeline.end_ns for r in data.roles for t in r.timelines) * 1e-9
    metrics = {
        "rollout": {catalog.CLIPPED_RATIO: CLIPPED, catalog.TOKENS: 1_000.0},
        "reward": {catalog.FRAC_REWARD_ZERO_STD: FRAC_ZERO_STD},
        "actor": {catalog.SKIPPED_STEPS: skipped, catalog.IS_RATIO_MIN: 0.05},
    }
    return [step_record(run="synthetic", role=rt.role, step=step, ranks_expected=len(rt.timelines),
                        metrics=metrics[rt.role], finalized_at=end, timelines=rt.timelines)
            for rt in data.roles]


def settings(**goodput: object) -> Settings:
    return Settings.model_validate({
        "notifiers": {"console": {"enabled": False}},
        "goodput": {"gpus_per_rank": {"rollout": 2}, **goodput}})


def test_counters_equal_the_accounting_of_the_joined_steps() -> None:
    core = ServiceCore(settings(model_flops_per_token=6e9, peak_flops_per_gpu=1e12))
    try:
        for n in range(5, 9):  # step 6: the optimizer step was skipped (DeepSpeed overflow)
            core.publish(records(n, skipped=1.0 if n >= 6 else 0.0))
        # held until the run is two steps past: 5 and 6 are accounted, by the ledger's own
        # thread, woken after each batch's alerts are out
        wait_for(lambda: "synthetic" in core.goodput.runs
                 and core.goodput.runs["synthetic"].steps == 2, 10, "steps 5 and 6 accounted")
        assert core.goodput.account() == [] and core.goodput.errors == 0
        core.finish_run("synthetic")
        assert core.goodput.runs["synthetic"].steps == 4
        spans = SpanMap()
        want: dict[tuple[str, Bucket, str], float] = {}
        for n in range(5, 9):
            got = account_step(step_input(n, "skipped" if n == 6 else ""), spans)
            for key, value in got.seconds.items():
                want[key] = want.get(key, 0.0) + value
        series = scrape(core.metrics)
        exported = {(dict(k)["role"], Bucket(dict(k)["bucket"]), dict(k)["reason"]): v
                    for (name, k), v in series.items() if name == GOODPUT_SECONDS.name}
        # a step's neighbours only move idle between reasons, never between buckets
        for bucket in Bucket:
            assert sum(v for k, v in exported.items() if k[1] is bucket) == pytest.approx(
                sum(v for k, v in want.items() if k[1] is bucket), abs=1e-6), bucket
        assert exported[("actor", Bucket.WASTED, "discarded")] == pytest.approx(
            want[("actor", Bucket.WASTED, "discarded")], abs=1e-6)
        productive = sum(v for k, v in want.items() if k[1] is Bucket.PRODUCTIVE)
        ratio = series[(GOODPUT_RATIO.name, (("run", "synthetic"),))]
        assert ratio == pytest.approx(productive / sum(want.values()))
        total = sum(want.values())
        assert series[(MFU.name, (("run", "synthetic"),))] == pytest.approx(
            4 * 1_000 * 6e9 / (total * 1e12))
    finally:
        core.close()


def test_alert_cost_since_onset_in_events_history_and_bodies(tmp_path: Path) -> None:
    start = step_input(5).roles[0].timelines[0].timeline.start_ns * 1e-9
    # ISRatioStale firing at its first bad step and resolving at the first good one (no
    # persistence, no hysteresis): the scenario is short
    rules = [r.model_copy(update={"resolve_after": 1, "for_steps": 1})
             if r.name == "ISRatioStale" else r
             for r in default_rules()]
    core = ServiceCore(settings(price_per_gpu_hour=2.5), state_dir=tmp_path,
                       clock=lambda: start + 100.0, rules=rules)
    try:
        fired: list[AlertEvent] = []
        for n in range(5, 8):
            fired += [e for e in core.publish(records(n)) if e.alert == "ISRatioStale"]
        (firing,) = fired
        # while it fires, /metrics says what it has cost so far (to the service's clock)
        cost = scrape(core.metrics)[(ALERT_COST.name, (("alert", "ISRatioStale"), ("role", "actor"),
                                                ("run", "synthetic")))]
        assert cost == pytest.approx(9 * 100.0 / 3600)
        gpus = 2 * 2 + 1 + 4  # two rollout engines of 2 GPUs, a reward worker, 4 trainers
        onset = step_input(5).roles[0].timelines[0].timeline.start_ns * 1e-9
        assert firing.onset == pytest.approx(onset)
        want = alert_cost(onset, onset + STEP_NS * 1e-9, gpus, Price(2.5))
        assert firing.gpus == gpus
        assert firing.gpu_hours == pytest.approx(want.gpu_hours)
        assert firing.money == pytest.approx(want.gpu_hours * 2.5)
        assert firing.cost_note.startswith(f"firing for 1.0 s: {gpus} GPUs, ")
        assert firing.cost_note in summary_line(firing)
        # the resolve says the whole incident's cost, from the same onset
        late = records(9)
        for r in late:
            object.__setattr__(r, "metrics", {**r.metrics, catalog.IS_RATIO_MIN: 0.9})
        (resolved,) = [e for e in core.publish(late) if e.alert == "ISRatioStale"]
        assert resolved.state == "resolved" and resolved.onset == firing.onset
        assert resolved.gpu_hours == pytest.approx(gpus * 5 * STEP_NS * 1e-9 / 3600)
        assert resolved.cost_note.startswith("lasted 5.0 s")
        assert not [k for k in scrape(core.metrics) if k[0] == ALERT_COST.name]
        rows = [a for a in core.history.alerts("synthetic", cost=True)
                if a["alert"] == "ISRatioStale"]
        assert [(a["state"], a["gpu_hours"]) for a in rows] == [
            ("firing", pytest.approx(firing.gpu_hours)),
            ("resolved", pytest.approx(resolved.gpu_hours))]
        assert rows[1]["cost_note"] == resolved.cost_note and rows[1]["money"] > rows[0]["money"]
        text = json.dumps(slack_body([firing], None, "rlmon"))
        assert "Cost so far: firing for 1.0 s" in text and "USD" in text
        details = pagerduty_body(firing, {}, "g", None)["payload"]["custom_details"]
        assert details["cost"]["gpu_hours"] == pytest.approx(firing.gpu_hours)
        assert webhook_body([resolved], None)["alerts"][0]["cost"]["text"] == resolved.cost_note
    finally:
        core.close()


def test_ledger_holds_two_steps_and_forgets() -> None:
    ledger = GoodputLedger()
    for n in range(200):
        for r in records(5):
            ledger.add(step_record(run=r.run, role=r.role, step=n, ranks_expected=r.ranks_expected,
                                   ranks_reporting=r.ranks_reporting, timelines=r.timelines))
        accounted = ledger.account()  # what the service calls after a batch's alerts are out
        assert [a.step for a in accounted] == ([n - 2] if n >= 2 else [])
    assert ledger.runs["synthetic"].steps == 198
    assert ledger.run_gpus("synthetic") == 2 + 1 + 4  # 1 GPU per rank without config
    ledger.forget(["synthetic"])
    assert ledger.snapshot() == {} and ledger.run_gpus("synthetic") == 0


def test_a_run_forgotten_while_its_steps_are_accounted_leaves_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The accounting runs outside the ledger's lock, on its own thread: a run the service
    forgets meanwhile must not be brought back by the results (a leak under load)."""
    from rlmon.service.goodput import ledger as ledger_module

    ledger = GoodputLedger()
    for r in records(5):
        ledger.add(r)

    def forgotten_meanwhile(*args: object, **kwargs: object) -> object:
        ledger.forget(["synthetic"])
        return account_step(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ledger_module, "account_step", forgotten_meanwhile)
    assert [a.step for a in ledger.finish("synthetic")] == [5]  # accounted, then dropped
    assert ledger.snapshot() == {} and ledger.run_gpus("synthetic") == 0
    assert ledger._redoable == {} and ledger.runs == {}


def test_gpus_per_rank_config_then_the_reporters_then_the_default() -> None:
    ledger = GoodputLedger(GoodputConfig(gpus_per_rank={"actor": 2.0, "*": 3.0}))
    ledger.declare("synthetic", "actor", 8.0)  # the config's entry for the role wins
    ledger.declare("synthetic", "rollout", 4.0)  # the Reporters' say beats the config's "*"
    for r in records(5):
        ledger.add(r)
    assert ledger.run_gpus("synthetic") == 4 * 2.0 + 2 * 4.0 + 1 * 3.0
    (step,) = ledger.finish("synthetic")
    assert step.gpus == {"actor": 8.0, "rollout": 8.0, "reward": 3.0}
