"""The exporter: exposition built at scrape time, cardinality budget, TTL, labels, self-metrics, /healthz."""

from __future__ import annotations

from rlmon.service.aggregation.aggregator_stats import AggregatorStats
from rlmon.service.alerting.engine import AlertEngine
from rlmon.service.alerting.rules import default_rules
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.export.exporter import (
    MetricsState,
    RunInfo,
    exported_metric_names,
)
from rlmon.service.metrics import catalog
from rlmon.service.redact import Redactor
from tests.support.clock import FakeClock
from tests.support.paths import REPO
from tests.support.records import step_record
from tests.support.scrape import labels, scrape

IS_RATIO = catalog.get("actor/is_ratio").prometheus_name
ENTROPY = catalog.get("actor/entropy").prometheus_name



def record(step: int, run: str = "grpo-7b", role: str = "actor", complete: bool = True,
           **values: float) -> StepRecord:
    metrics = {k.replace("__", "/"): v for k, v in values.items()}
    return step_record(run=run, role=role, step=step, complete=complete, ranks_expected=4,
                       ranks_reporting=4 if complete else 3, metrics=metrics)


def test_latest_step_per_run_and_role() -> None:
    state = MetricsState()
    state.update(record(1, actor__is_ratio=1.0, actor__entropy=0.5))
    state.update(record(2, actor__is_ratio=1.1))
    state.update(record(1, actor__is_ratio=9.0))  # older: ignored
    state.update(record(5, run="other", actor__is_ratio=0.9))
    got = scrape(state)
    assert got[(IS_RATIO, labels(run="grpo-7b", role="actor"))] == 1.1
    assert got[(IS_RATIO, labels(run="other", role="actor"))] == 0.9
    assert (ENTROPY, labels(run="grpo-7b", role="actor")) not in got  # not in the latest step
    assert got[("rlmon_step", labels(run="grpo-7b", role="actor"))] == 2
    assert got[("rlmon_ranks_expected", labels(run="grpo-7b", role="actor"))] == 4


def test_incomplete_step_nan_and_alerts() -> None:
    state = MetricsState()
    engine = AlertEngine(default_rules())
    rec = record(3, complete=False, actor__is_ratio=3.0, actor__loss=float("nan"))
    state.update(rec, engine.evaluate(rec))
    got = scrape(state)
    key = labels(run="grpo-7b", role="actor")
    assert got[("rlmon_step_complete", key)] == 0
    assert got[("rlmon_ranks_reporting", key)] == 3
    assert got[("rlmon_nonfinite_metrics", key)] == 1
    loss = got[(catalog.get("actor/loss").prometheus_name, key)]
    assert loss != loss  # NaN is exported as NaN, not dropped or zeroed
    firing = {dict(lbl)["alert"]: dict(lbl)["severity"] for (name, lbl), v in got.items()
              if name == "rlmon_alert_firing" and v == 1}
    assert firing == {"ISRatioDivergence": "critical", "NonFiniteMetric": "critical",
                      "RankMissing": "critical"}
    for n in range(4, 4 + catalog.RESOLVE_AFTER):  # good steps in a row resolve (hysteresis)
        ok = record(n, actor__is_ratio=1.0, actor__loss=0.1)
        state.update(ok, engine.evaluate(ok))
    got = scrape(state)
    assert not [k for k in got if k[0] == "rlmon_alert_firing"]  # resolved series vanish


def test_run_info_and_self_metrics() -> None:
    state = MetricsState()
    state.update(record(1, actor__is_ratio=1.0))
    state.set_run_info("grpo-7b", RunInfo(framework="openrlhf", framework_version="0.8.5",
                                          algorithm="grpo", loss_reduction="token_mean", dp=8,
                                          cp=2, tp=1, pp=1, grad_accumulation=4, zero_stage=2,
                                          tags=("baseline", "7b")))
    state.ingest = lambda: AggregatorStats(partials=900, rejected=2, late=1, reporter_dropped=3)
    got = scrape(state)
    info = next(dict(lbl) for (name, lbl), _ in got.items() if name == "rlmon_run_info")
    assert info == {"run": "grpo-7b", "framework": "openrlhf", "framework_version": "0.8.5",
                    "algorithm": "grpo", "loss_reduction": "token_mean", "dp": "8", "cp": "2",
                    "tp": "1", "pp": "1", "grad_accumulation": "4", "zero_stage": "2",
                    "deepspeed_version": "", "dpo": "false", "tags": "baseline,7b"}
    assert got[("rlmon_partials_ingested_total", ())] == 900
    assert got[("rlmon_partials_rejected_total", ())] == 2
    assert got[("rlmon_partials_late_total", ())] == 1
    assert got[("rlmon_partials_dropped_total", ())] == 3
    assert ("rlmon_exporter_scrape_duration_seconds", ()) in got


def test_cardinality_budget_refuses_and_counts() -> None:
    state = MetricsState(max_series=7 + 2)  # one stream's 7 fixed series + 2 metrics
    state.update(record(1, actor__is_ratio=1.0, actor__entropy=0.5, actor__kl=0.1))
    state.update(record(1, run="second", actor__is_ratio=1.0))
    got = scrape(state)
    assert state.series == 9
    assert got[("rlmon_exporter_series_refused_total", ())] == 1 + 7  # one metric, one stream
    assert (catalog.get("actor/kl").prometheus_name, labels(run="grpo-7b", role="actor")) not in got
    assert not [k for k in got if dict(k[1]).get("run") == "second"]
    state.update(record(2, actor__is_ratio=1.0, actor__entropy=0.5, actor__kl=0.1))
    assert scrape(state)[("rlmon_exporter_series_refused_total", ())] == 8  # counted once


def test_dead_and_finished_runs_disappear_after_ttl() -> None:
    clock = FakeClock(100.0)
    state = MetricsState(run_ttl=60, finished_ttl=10, clock=clock)
    state.update(record(1, run="dead", actor__is_ratio=1.0))
    state.update(record(1, run="done", actor__is_ratio=1.0))
    state.update(record(1, run="alive", actor__is_ratio=1.0))
    state.set_run_info("done", RunInfo(framework="verl"))
    state.finish_run("done")
    clock.now += 11
    state.update(record(2, run="alive", actor__is_ratio=1.0))
    runs = {dict(k[1]).get("run") for k in scrape(state)} - {None}
    assert runs == {"dead", "alive"}
    clock.now += 50
    state.update(record(3, run="alive", actor__is_ratio=1.0))
    got = scrape(state)
    assert {dict(k[1]).get("run") for k in got} - {None} == {"alive"}
    assert got[("rlmon_exporter_streams_expired_total", ())] == 2
    assert state.series == 7 + 1


def test_finishes_of_runs_never_shown_are_not_kept() -> None:
    clock = FakeClock(100.0)
    state = MetricsState(run_ttl=60, finished_ttl=10, clock=clock)
    for i in range(1000):
        state.finish_run(f"never-{i}")  # finish_run before (or without) any step
    clock.now += 11
    scrape(state)
    assert len(state._finished) == 0


def test_labels_are_sanitized_and_redacted() -> None:
    secret = "xoxb-very-secret-token"
    state = MetricsState(redactor=Redactor([secret]))
    state.update(step_record(run="r1", step=1, metrics={f"user/{secret}\n": 1.0, "x" * 300: 2.0}))
    got = scrape(state)
    custom = [dict(k[1])["metric"] for k in got if k[0] == "rlmon_custom_metric"]
    assert "user/***" in custom
    assert all(secret not in c and "\n" not in c and len(c) <= 128 for c in custom)


def test_docs_list_every_exported_family() -> None:

    page = (REPO / "docs" / "metrics.md").read_text()
    section = page.split("## Exported metrics", 1)[1]
    missing = [name for name in exported_metric_names() if f"`{name}`" not in section]
    assert not missing


def test_run_info_set_before_the_first_step_is_kept() -> None:
    clock = FakeClock(100.0)
    state = MetricsState(run_ttl=60, clock=clock)
    state.set_run_info("early", RunInfo(framework="skyrl"))
    state.update(record(1, run="other", actor__is_ratio=1.0))  # expiry runs on every update
    state.update(record(1, run="early", actor__is_ratio=1.0))
    infos = {dict(lbl)["run"] for (name, lbl), _ in scrape(state).items() if name == "rlmon_run_info"}
    assert infos == {"early"}
    clock.now += 61  # metadata of a run that never reports goes after the run TTL
    state.set_run_info("never", RunInfo(framework="trl"))
    clock.now += 61
    state.update(record(2, run="other", actor__is_ratio=1.0))
    infos = {dict(lbl)["run"] for (name, lbl), _ in scrape(state).items() if name == "rlmon_run_info"}
    assert "never" not in infos
