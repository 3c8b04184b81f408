"""Metric names that read as SQL reach the curves' reader only as bound parameters (issue 32):
each name a real Reporter sends is plotted with the values it reported, on the run page's
panels, the alert page's values around an onset and when picked by name."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rlmon.actors.reporter import Reporter
from rlmon.actors.reporter.sink import LocalSink
from rlmon.service.service_core import ServiceCore
from tests.support.web_support import serving

RUN = "hostile"
# each reports its own value; "qm" is what the first one read instead on main (42)
HOSTILE = {
    "q' || (SELECT 'm') || '": 1.0,
    "eval/children's_books_acc": 2.0,
    'eval/say "hi"': 3.0,
    "r' || (WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 1000) "
    "SELECT COUNT(*) FROM c) || '": 4.0,
    "qm": 42.0,
    "eval/back\\slash": 5.0,
    "eval/r\u00e9compense": 6.0,
}


@pytest.fixture
def service(tmp_path: Path) -> Iterator[ServiceCore]:
    sink = LocalSink()
    reporter = Reporter(RUN, "probe", sink=sink, step_seconds=False, hardware_interval=None)
    for step in range(5):
        for name, value in HOSTILE.items():
            reporter.record(name, value=value + step)
        reporter.end_step(step)
    assert reporter.flush(10)
    reporter.close()
    records = [*sink.records, *sink.finalize_all()]
    assert len(records) == 5
    with serving(tmp_path, records) as core:
        yield core


def get(core: ServiceCore, path: str, **params: str) -> Any:
    url = f"http://127.0.0.1:{core.port}{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read())


def test_each_hostile_name_is_plotted_as_reported(service: ServiceCore) -> None:
    body = get(service, "/api/curves", run=RUN, role="probe")
    plotted = {p["metrics"][0]: p["y"][0] for p in body["panels"]}
    assert plotted == {name: [value + s for s in range(5)] for name, value in HOSTILE.items()}


def test_a_hostile_name_picked_by_name_is_plotted_as_reported(service: ServiceCore) -> None:
    for name, value in HOSTILE.items():
        body = get(service, "/api/curves", run=RUN, role="probe", metrics=name)
        assert [(p["metrics"], p["y"]) for p in body["panels"]] == [
            ([name], [[value + s for s in range(5)]])]


def test_every_metric_reported_is_listed_for_the_picker(service: ServiceCore) -> None:
    body = get(service, "/api/metrics", run=RUN, role="probe")
    assert body["metrics"] == sorted(HOSTILE) and body["attempts"] == [0]
