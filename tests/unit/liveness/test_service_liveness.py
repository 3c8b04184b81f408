"""Liveness end to end in process: an aggregator core on simulated time, its views through the
service into alerts, the history store and /metrics; restarts neither forget nor page twice."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rlmon.cli import main
from rlmon.service.aggregation.aggregator import AggregatorCore
from rlmon.service.aggregation.watermark import WatermarkStore
from rlmon.service.config import Settings
from rlmon.service.service_core import ServiceCore
from tests.support.scrape import Samples, scrape
from tests.unit.liveness.support import beat, sim_clock, step_message


def _settings() -> Settings:
    return Settings.model_validate({"notifiers": {"console": {"enabled": False}},
                                    "exporter": {"run_ttl_seconds": 60}})


class Cluster:
    """An aggregator core and a service on one simulated clock; runs of two ranks."""

    def __init__(self, tmp: Path) -> None:
        self.tmp, self.clock = tmp, sim_clock()
        self.core = self._core()
        self.service = self._service()
        self.events: list[tuple[float, str, str, str]] = []  # (time, run, alert, state)
        self.steps: dict[str, int] = {}

    def _core(self) -> AggregatorCore:
        return AggregatorCore(store=WatermarkStore(self.tmp / "w.sqlite"), clock=self.clock,
                              wall_clock=self.clock.wall)

    def _service(self) -> ServiceCore:
        return ServiceCore(_settings(), state_dir=self.tmp / "state", clock=self.clock)

    def restart_service(self) -> None:
        self.service.close(0.0)
        self.service = self._service()

    def restart_aggregator(self) -> None:
        self.core = self._core()

    def tick(self) -> None:
        self.core.tick()
        records = self.core.pending_records(10_000)
        if records:
            self.service.publish(records)
            self.core.delivered(records)
        for e in self.service.liveness(self.core.take_views()):
            self.events.append((self.clock.wall(), e.run, e.alert, e.state))

    def run(self, seconds: float, runs: dict[str, dict[str, Any]]) -> None:
        """Advance ``seconds`` in 1 s ticks; per run: step (bool), beat (bool), span (name)."""
        for _ in range(int(seconds)):
            self.clock.advance(1.0)
            now = self.clock.wall()
            for run, how in runs.items():
                if how.get("step"):
                    n = self.steps.get(run, 0)
                    self.core.ingest([step_message(run, n, dp, 2, seq=n + 1) for dp in (0, 1)])
                    self.steps[run] = n + 1
                if how.get("beat", True):
                    span = how.get("span")
                    for dp in (0, 1):
                        spans = ((str(span), float(how.get("since", now))),) if span else ()
                        self.core.heartbeat([beat(run, dp, 2, spans, at=now,
                                                  closing=bool(how.get("close")))])
            self.tick()

    def scrape(self) -> Samples:
        return scrape(self.service.metrics)

    def fired(self, run: str) -> list[tuple[str, str]]:
        return [(alert, state) for _, r, alert, state in self.events if r == run]


def test_hang_death_and_clean_finish_page_once_each(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    c = Cluster(tmp_path)
    steady = {"step": True}
    c.run(30, {"hung": steady, "killed": steady, "done": steady})
    stopped = c.clock.wall()
    c.run(150, {"hung": {"span": "generate", "since": stopped},
                "killed": {"beat": False}, "done": {"close": True}})
    assert c.fired("hung") == [("RunStalled", "firing")]
    assert c.fired("killed") == [("RunDied", "firing")]
    assert c.fired("done") == []
    stall_at = next(t for t, r, a, _ in c.events if r == "hung")
    assert 90 < stall_at - stopped <= 93
    died_at = next(t for t, r, a, _ in c.events if r == "killed")
    assert 30 <= died_at - stopped <= 33
    firing = {(a["run"], a["alert"]) for a in c.service.history.firing_alerts()}
    assert {("hung", "RunStalled"), ("killed", "RunDied")} <= firing
    stalled = next(e for e in c.service.spine.commit.events if e.alert == "RunStalled")
    assert "generate" in stalled.detail and "2 ranks" in stalled.detail
    assert "GPU-hours" in stalled.cost_note and stalled.gpus == 2
    # nothing vanishes: past the exporter's run TTL the stalled and dead runs are still shown
    c.run(120, {"hung": {"span": "generate", "since": stopped}, "killed": {"beat": False},
                "done": {"close": True}})
    got = c.scrape()
    key = ("rlmon_run_state", (("role", "actor"), ("run", "hung"), ("state", "stalled")))
    assert got[key] == 1.0
    assert got[("rlmon_run_state", (("role", "actor"), ("run", "killed"), ("state", "dead")))] == 1
    assert ("rlmon_step", (("role", "actor"), ("run", "hung"))) in got
    assert got[("rlmon_alert_firing", (("alert", "RunStalled"), ("role", "actor"), ("run", "hung"),
                                       ("severity", "critical")))] == 1
    assert ("rlmon_last_step_timestamp_seconds", (("role", "actor"), ("run", "hung"))) in got
    c.service.close(0.0)
    # `rlmon alerts` shows the stalled and dead runs, where the ranks are, and their alerts
    assert main(["alerts", "--state-dir", str(tmp_path / "state"), "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    states = {(r["run"], r["state"]) for r in found["liveness"]}
    assert states == {("hung", "stalled"), ("killed", "dead")}
    hung = next(r for r in found["liveness"] if r["run"] == "hung")
    assert "generate" in hung["detail"] and hung["last_step"] == 29
    assert {(a["run"], a["alert"]) for a in found["firing"]} >= {("hung", "RunStalled"),
                                                                 ("killed", "RunDied")}


def test_restarts_neither_forget_a_stall_nor_page_it_twice_and_resuming_resolves(
        tmp_path: Path) -> None:
    c = Cluster(tmp_path)
    c.run(30, {"r": {"step": True}})
    c.run(100, {"r": {"span": "train"}})
    assert c.fired("r") == [("RunStalled", "firing")]
    c.restart_service()
    c.restart_aggregator()
    c.run(30, {"r": {"span": "train"}})
    assert c.fired("r") == [("RunStalled", "firing")]  # not paged again
    assert any(a["alert"] == "RunStalled" for a in c.service.history.firing_alerts("r"))
    c.run(5, {"r": {"step": True}})
    assert c.fired("r") == [("RunStalled", "firing"), ("RunStalled", "resolved")]
    c.service.close(0.0)


def test_a_service_restart_mid_stall_still_pages_once(tmp_path: Path) -> None:
    c = Cluster(tmp_path)
    c.run(30, {"r": {"step": True}})
    c.run(60, {"r": {"span": "train"}})  # not yet stalled
    c.restart_service()
    c.run(40, {"r": {"span": "train"}})
    assert c.fired("r") == [("RunStalled", "firing")]
    c.service.close(0.0)


def test_a_bad_heartbeat_is_refused_alone(tmp_path: Path) -> None:
    """A heartbeat riding on a step that breaks the contract costs neither the step nor the
    batch: it is counted and its error named."""
    from dataclasses import replace

    c = Cluster(tmp_path)
    bad = replace(beat("r", 0, 2), run="not a run id!")
    ack = c.core.ingest([step_message("r", 0, 0, 1, heartbeat=bad)])
    assert ack.finalized == 1 and ack.rejected == 0
    assert any("heartbeat" in e and "run" in e for e in ack.errors)
    assert c.core.heartbeats_refused == 1
    c.service.close(0.0)


def test_heartbeats_riding_through_a_node_merger_reach_the_root(tmp_path: Path) -> None:
    from rlmon.service.aggregation.node_merge import NodeMerger

    c = Cluster(tmp_path)
    merger = NodeMerger()
    now = c.clock.wall()
    merger.ingest([step_message("tier", 0, dp, 2, heartbeat=beat("tier", dp, 2,
                                                                 (("generate", now),), at=now))
                   for dp in (0, 1)])
    batch = merger.next_batch()
    assert batch is not None and len(batch.heartbeats) == 2
    c.core.merge_batch(batch)
    view = c.core.liveness.view("tier", "actor", now)
    assert view is not None and view.heartbeats
    assert [g.stage for g in view.where] == ["generate"]
    c.service.close(0.0)
