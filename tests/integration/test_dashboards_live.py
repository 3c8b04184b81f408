"""Every PromQL expression and variable query of every dashboard names only series that a live
rlmon exporter serves.

Set-up, all in-process and on 127.0.0.1: the bundled example run is replayed into the real
service core (rlmon.service.service_core.ServiceCore: alert engine, SQLite outbox, dispatcher, exporter
HTTP server). Alerts are routed to the console and to a webhook URL where nothing listens, so the
notification-outcome and outbox-depth families carry real samples (sent and retried). Then
``/metrics`` is scraped over HTTP and parsed with client_python's parser.
"""

from __future__ import annotations

import re
import socket
import urllib.request
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rlmon.service.aggregation.aggregator_stats import AggregatorStats
from rlmon.service.config import load_config
from rlmon.service.contract.run_info import RunInfo
from rlmon.service.dashboards import DASHBOARDS, model
from rlmon.service.export import series
from rlmon.service.export.exporter import exported_metric_names
from rlmon.service.metrics import catalog
from rlmon.service.replay import replay
from rlmon.service.service_core import ServiceCore
from tests.support.alerting_support import wait_for
from tests.support.promql_names import metric_names

pytestmark = pytest.mark.slow

_LABEL_VALUES = re.compile(r"^label_values\((?P<selector>[^,]+),\s*(?P<label>\w+)\)$")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, set[str]]]:
    """Series name -> the label names its samples carry, from one live scrape."""
    data = resources.files("rlmon") / "data" / "example_run.jsonl"
    result = replay(data.read_text(encoding="utf-8").splitlines())
    assert result.steps, "the example run should produce steps"
    assert result.alerts, "the example run should raise alerts"
    state: Path = tmp_path_factory.mktemp("service")
    # a port we hold bound but never listen on: connections are refused for as long as we hold
    # it, so the webhook is retried whoever else runs on this machine
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    settings = load_config(None, routing={"critical": ["console", "webhook"],
                                          "warning": ["console", "webhook"]},
                           notifiers={"webhook": {
                               "url": f"http://127.0.0.1:{dead.getsockname()[1]}/x"}})
    core = ServiceCore(settings, state_dir=state, port=0, host="127.0.0.1").start()
    try:
        core.publish([record for record, _ in result.steps],
                     stats=AggregatorStats(partials=result.counters.partials,
                                          late=result.counters.late))
        # after publish: MetricsState drops the info of a run that has no live stream yet
        run = result.steps[0][0].run
        core.metrics.set_run_info(run, RunInfo(framework="example", algorithm="grpo", dp=2, cp=2))
        wait_for(lambda: {("console", "sent"), ("webhook", "retried")}
                 <= set(core.dispatcher.stats().outcomes), 60.0, "console and webhook outcomes")
        url = f"http://127.0.0.1:{core.port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as answer:
            text = answer.read().decode()
        served: dict[str, set[str]] = {}
        for family in text_string_to_metric_families(text):
            # a declared family counts even without samples (a catalog metric this run never
            # recorded): the exporter declares every catalog family on every scrape
            suffix = {"counter": "_total", "info": "_info"}.get(family.type, "")
            served.setdefault(family.name + suffix, set())
            for sample in family.samples:
                served.setdefault(sample.name, set()).update(sample.labels)
        yield served
    finally:
        core.close()
        dead.close()


def test_every_dashboard_query_names_only_served_series(served: dict[str, set[str]]) -> None:
    checked = 0
    for dash in DASHBOARDS:
        m = model(dash)
        items = [p for p in m["panels"]] + [q for p in m["panels"] for q in p.get("panels", [])]
        exprs = [t["expr"] for p in items for t in p.get("targets", [])]
        exprs += [a["expr"] for a in m["annotations"]["list"] if "expr" in a]
        for expr in exprs:
            names = metric_names(expr)
            assert names, expr
            missing = names - set(served)
            assert not missing, f"{dash.uid}: {expr!r} names {missing}, not served"
            checked += 1
        for var in m["templating"]["list"]:
            if var["type"] != "query":
                continue
            match = _LABEL_VALUES.match(var["query"])
            assert match, var["query"]
            (name,) = metric_names(match["selector"])
            assert name in served, var["query"]
            if var["name"] != "instance":  # `instance` is the scrape target's, added by Prometheus
                assert match["label"] in served[name], var["query"]
    assert checked > 60


def test_structural_series_carry_run_and_role(served: dict[str, set[str]]) -> None:
    for name in ("rlmon_step", "rlmon_ranks_reporting", "rlmon_ranks_expected",
                 catalog.get("actor/is_ratio").prometheus_name):
        assert {"run", "role"} <= served[name], name
    assert {"run", "role", "alert", "severity"} <= served["rlmon_alert_firing"]
    assert {"destination", "outcome"} <= served["rlmon_notifications_total"]


def test_self_metric_names_match_the_exporter(served: dict[str, set[str]]) -> None:
    declared = [*series.SELF_MONITORING, *series.STREAM_STATE, series.ALERT_FIRING,
                series.RUN_INFO, series.CUSTOM_METRIC]
    assert {s.name for s in declared} <= set(exported_metric_names())
    assert {s.name for s in declared} <= set(served)
    for s in declared:  # the labels a scrape shows are the declared ones (an info family adds
        if s.kind != "info":  # its metadata as labels of its own)
            assert served[s.name] <= set(s.labels), (s.name, served[s.name])
