"""A stall costs what every alert costs (rlmon.service.goodput.cost): the run's GPUs as the
goodput ledger knows them, from the last step to now, in the notification, the history row, the
/metrics gauge and the run report; and an alert firing across a service restart still costs its
whole span on resolve."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlmon.service.alerting.engine import AlertEvent, AlertState
from rlmon.service.alerting.notify.render import summary_line
from rlmon.service.config import Settings
from rlmon.service.report.model import build_report
from rlmon.service.service_core import ServiceCore
from tests.unit.liveness.test_service_liveness import Cluster

GPUS_PER_RANK = 4.0  # the config's entry for the role: 2 ranks x 4 = 8 GPUs
PRICE = 2.5


class CostCluster(Cluster):
    """The liveness cluster with a priced goodput config, the service on unix time, and every
    event kept whole (across restarts)."""

    def __init__(self, tmp: Path) -> None:
        self.all: list[AlertEvent] = []
        super().__init__(tmp)

    def _service(self) -> ServiceCore:
        settings = Settings.model_validate({
            "notifiers": {"console": {"enabled": False}},
            "goodput": {"gpus_per_rank": {"actor": GPUS_PER_RANK},
                        "price_per_gpu_hour": PRICE, "currency": "EUR"}})
        return ServiceCore(settings, state_dir=self.tmp / "state", clock=self.clock.wall)

    def tick(self) -> None:
        seen = len(self.service.spine.commit.events)
        super().tick()
        self.all.extend(list(self.service.spine.commit.events)[seen:])

    def stalled(self) -> list[AlertEvent]:
        return [e for e in self.all if e.alert == "RunStalled"]


def _priced(event: AlertEvent) -> tuple[float, float]:
    """(onset, GPU-hours) of an event that carries its cost."""
    assert event.onset is not None and event.gpu_hours is not None
    return event.onset, event.gpu_hours


def _check_cost(event: AlertEvent, seconds: float) -> None:
    gpus = 2 * GPUS_PER_RANK
    assert event.gpus == gpus
    assert event.gpu_hours == pytest.approx(gpus * seconds / 3600.0, rel=1e-9)
    assert event.money == pytest.approx(_priced(event)[1] * PRICE, rel=1e-9)
    assert "GPU-hours" in event.cost_note and "EUR" in event.cost_note


def test_a_stall_costs_from_its_last_step_in_every_place(tmp_path: Path) -> None:
    c = CostCluster(tmp_path)
    c.run(30, {"r": {"step": True}})
    c.run(100, {"r": {"span": "generate"}})
    (fired,) = c.stalled()
    onset, fired_hours = _priced(fired)
    view = c.core.liveness.view("r", "actor", c.clock.wall())
    assert view is not None and onset == view.last_step_at
    fired_at = onset + fired_hours * 3600.0 / fired.gpus
    _check_cost(fired, fired_at - onset)
    assert fired.cost_note in summary_line(fired)  # the notification's text
    # while it fires, the gauge counts on (to the service's clock)
    gauge = c.scrape()[("rlmon_alert_cost_gpu_hours",
                        (("alert", "RunStalled"), ("role", "actor"), ("run", "r")))]
    assert gauge == pytest.approx(8 * (c.clock.wall() - onset) / 3600.0, rel=1e-9)
    c.run(3, {"r": {"step": True}})
    resolved = c.stalled()[-1]
    assert resolved.state == "resolved" and resolved.onset == onset
    assert _priced(resolved)[1] > fired_hours
    resolved_at = onset + _priced(resolved)[1] * 3600.0 / 8
    _check_cost(resolved, resolved_at - onset)
    assert c.clock.wall() - 3 <= resolved_at <= c.clock.wall()
    rows = [a for a in c.service.history.alerts("r", cost=True) if a["alert"] == "RunStalled"]
    assert [(a["state"], a["onset"], a["gpu_hours"]) for a in rows] == [
        ("firing", fired.onset, fired.gpu_hours), ("resolved", fired.onset, resolved.gpu_hours)]
    assert rows[1]["money"] == pytest.approx(resolved.money) and rows[1]["cost_note"]
    assert not any(k[0] == "rlmon_alert_cost_gpu_hours" for k in c.scrape())
    report = build_report(c.service.history, "r", c.service.settings.goodput)
    (entry,) = [a for a in report.alerts if a.alert == "RunStalled"]
    assert entry.gpu_hours == resolved.gpu_hours and entry.money == pytest.approx(resolved.money)
    c.service.close(0.0)


def test_a_stall_firing_across_a_service_restart_costs_its_whole_span(tmp_path: Path) -> None:
    c = CostCluster(tmp_path)
    c.run(30, {"r": {"step": True}})
    c.run(100, {"r": {"span": "train"}})
    (fired,) = c.stalled()
    onset, _ = _priced(fired)
    c.restart_service()
    c.restart_aggregator()
    c.run(40, {"r": {"span": "train"}})
    # the restarted service counts on from the saved onset
    gauge = c.scrape()[("rlmon_alert_cost_gpu_hours",
                        (("alert", "RunStalled"), ("role", "actor"), ("run", "r")))]
    assert gauge == pytest.approx(8 * (c.clock.wall() - onset) / 3600.0, rel=1e-9)
    c.run(3, {"r": {"step": True}})
    resolved = c.stalled()[-1]
    assert [e.state for e in c.stalled()] == ["firing", "resolved"]
    assert resolved.onset == fired.onset
    span = _priced(resolved)[1] * 3600.0 / 8
    assert 140 <= span <= 147  # 40 s + 100 s stalled, to the resolve
    _check_cost(resolved, span)
    c.service.close(0.0)


def test_an_alert_state_keeps_its_onset_and_gpus_across_a_restart(tmp_path: Path) -> None:
    """The onset and GPUs saved with the state: the restarted service counts on from them,
    on the GPUs held at onset while the ledger knows no rank of the run yet."""
    settings = Settings.model_validate({"notifiers": {"console": {"enabled": False}}})
    service = ServiceCore(settings, state_dir=tmp_path)
    key = ("r", "actor", "LossNaN")
    onset = 1_700_000_000.0
    service.history.add([], [], states={
        key: AlertState(true_steps=3, firing=True, onset=onset, gpus=16.0)})
    service.close(0.0)
    again = ServiceCore(settings, state_dir=tmp_path)
    restored = again.spine.judge.engine.states[key]
    assert (restored.onset, restored.gpus) == (onset, 16.0)
    assert again.spine.judge.costs.firing(onset + 1_800.0) == {key: 8.0}
    again.close(0.0)


def test_a_dead_run_costs_from_its_last_step(tmp_path: Path) -> None:
    c = CostCluster(tmp_path)
    c.run(30, {"r": {"step": True}})
    c.run(60, {"r": {"beat": False}})
    (died,) = [e for e in c.all if e.alert == "RunDied"]
    view = c.core.liveness.view("r", "actor", c.clock.wall())
    assert view is not None and died.onset == view.last_step_at
    _, gpu_hours = _priced(died)
    assert 30 <= gpu_hours * 3600.0 / 8 <= 33  # dead after 30 s of silence
    _check_cost(died, gpu_hours * 3600.0 / 8)
    c.service.close(0.0)


def test_each_time_based_alert_has_its_own_onset() -> None:
    """StageStuck from the stuck rank's entry into its stage, StepTimeRegression from the
    run's entry into the slow state, RunStalled from the last step."""
    from rlmon.service.alerting.engine import AlertEngine
    from rlmon.service.alerting.liveness_alerts import liveness_events
    from rlmon.service.alerting.rules import default_rules
    from rlmon.service.liveness.run_state import LivenessView, RunState, StuckStage
    from rlmon.service.metrics.rank import Rank

    at = 1_700_000_000.0
    engine = AlertEngine(default_rules())
    stuck = StuckStage(Rank(dp=1), "reward", since=at - 200.0, usual=2.0, limit=60.0)
    slow = LivenessView("r", "actor", RunState.SLOW, since=at - 50.0, at=at, last_step=9,
                        last_step_at=at - 5.0, last_heard=at, period=2.0, threshold=90.0,
                        ranks=2, stuck=stuck, slow_ratio=4.0, heartbeats=True)
    onsets = {e.alert: e.onset for e in liveness_events(engine, slow) if e.state == "firing"}
    assert onsets == {"StageStuck": at - 200.0, "StepTimeRegression": at - 50.0}
    stalled = LivenessView("q", "actor", RunState.STALLED, since=at - 10.0, at=at, last_step=9,
                           last_step_at=at - 100.0, last_heard=at, period=2.0, threshold=90.0,
                           ranks=2, heartbeats=True)
    onsets = {e.alert: e.onset for e in liveness_events(engine, stalled) if e.state == "firing"}
    assert onsets == {"RunStalled": at - 100.0}
