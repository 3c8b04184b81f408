"""The stop switch: a rule with the stop action asks a run to stop only where the config lets it;
the decision survives a service restart, reaches Reporters through the aggregator (and the
node-merge tier) without the training thread waiting, and the notification says so."""

from __future__ import annotations

import itertools
import math
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from rlmon.actors.reporter import Reporter
from rlmon.service.alerting.notify.console import ConsoleNotifier
from rlmon.service.alerting.notify.render import pagerduty_body, slack_body, webhook_body
from rlmon.service.alerting.rules import RuleError, parse_rules
from rlmon.service.config import ConfigError, load_config
from rlmon.service.contract.step_message import StepMessage
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.contract.stop_decision import StopDecision
from rlmon.service.metrics import catalog
from rlmon.service.service_core import ServiceCore
from tests.support.clock import FakeClock
from tests.support.polling import PATIENCE_S, wait_for
from tests.support.records import step_record
from tests.support.stop_support import InProcess, stopping_settings

NAN_STOPS = "actions: {NonFiniteMetric: [stop]}\n"  # a default rule given the stop action



def step(run: str, n: int, value: float = 1.0, role: str = "actor") -> StepRecord:
    return step_record(run=run, role=role, step=n, metrics={catalog.REWARD: value})


def service(tmp_path: Path, rules: str, stop_runs: dict[str, list[str]] | None,
            clock: FakeClock | None = None) -> ServiceCore:
    return ServiceCore(stopping_settings(stop_runs), state_dir=tmp_path,
                       rules=parse_rules(rules), clock=clock).start()


# -- opt-in: the rule and the run glob ------------------------------------------------------------

@pytest.mark.parametrize(("rules", "stop_runs", "run", "stops"), [
    (NAN_STOPS, {"exp-*": ["NonFiniteMetric"]}, "exp-1", True),
    ("", {"exp-*": ["NonFiniteMetric"]}, "exp-1", False),  # the rule has no stop action
    (NAN_STOPS, None, "exp-1", False),  # no run opted in
    (NAN_STOPS, {"other-*": ["NonFiniteMetric"]}, "exp-1", False),  # the glob misses the run
    (NAN_STOPS, {"exp-*": ["ISRatio*"]}, "exp-1", False),  # the glob names other rules
    (NAN_STOPS, {"other-*": ["*"], "*": ["NonFinite*"]}, "exp-1", True),  # a later entry
])
def test_a_run_stops_only_when_the_rule_and_the_run_glob_both_opt_in(
        tmp_path: Path, rules: str, stop_runs: dict[str, list[str]] | None, run: str,
        stops: bool) -> None:
    core = service(tmp_path, rules, stop_runs)
    try:
        core.publish([step(run, 0)])
        (fired,) = core.publish([step(run, 1, math.nan)])
        assert (fired.alert, fired.state) == ("NonFiniteMetric", "firing")
        assert bool(fired.stop) is stops
        assert (run in core.stops_for([run])) is stops
        assert core.spine.stops.counts["NonFiniteMetric"] == int(stops)
        if stops:
            decision = core.stops_for([run])[run]
            assert (decision.alert, decision.step, decision.role) == ("NonFiniteMetric", 1, "actor")
            assert "NonFiniteMetric" in decision.reason and "NaN" in decision.reason
            assert decision.allowed_by in (stop_runs or {})
    finally:
        core.close()


def test_rule_files_and_config_name_the_field_when_wrong() -> None:
    rules = parse_rules("rules:\n- {name: RewardLow, severity: critical, condition: threshold,\n"
                        "   metric: rollout/reward, op: '<', threshold: -5, actions: [stop]}\n"
                        + NAN_STOPS)
    by_name = {r.name: r for r in rules}
    assert by_name["RewardLow"].actions == ("stop",)
    assert by_name["NonFiniteMetric"].actions == ("stop",)
    assert by_name["ISRatioDivergence"].actions == ()  # nothing stops by default
    with pytest.raises(RuleError, match="actions: no rule named 'Typo'"):
        parse_rules("actions: {Typo: [stop]}")
    with pytest.raises(RuleError, match=r"rules\[0\] \(R\): actions.0"):
        parse_rules("rules:\n- {name: R, severity: warning, condition: non_finite, "
                    "actions: [pause]}")
    with pytest.raises(ConfigError, match=r"stop\.runs\.0\.rules"):
        load_config(None, stop={"runs": [{"run": "*"}]})  # which rules may stop: say it
    assert load_config(None).stop.allowed_by("any", "NonFiniteMetric") is None


# -- the decision: persisted, renewed while the alert holds ---------------------------------------

def test_the_decision_survives_a_restart_and_is_renewed_only_while_the_alert_holds(
        tmp_path: Path) -> None:
    clock = FakeClock()
    core = service(tmp_path, NAN_STOPS, {"*": ["*"]}, clock)
    core.publish([step("r", 0, math.nan)])
    taken = core.stops_for(["r"])["r"]
    assert taken.at == clock.now
    core.close()
    clock.now += 60
    again = service(tmp_path, NAN_STOPS, {"*": ["*"]}, clock)
    try:
        assert again.stops_for(["r", "other"]) == {"r": taken}  # from the history store
        assert again.publish([step("r", 1, math.nan)]) == []  # still firing: no new page...
        renewed = again.stops_for(["r"])["r"]
        assert (renewed.step, renewed.at, renewed.reason) == (1, clock.now, taken.reason)
        assert again.spine.stops.counts["NonFiniteMetric"] == 0  # ... and no new stop counted
        clock.now += 60
        again.publish([step("r", 2, 1.0)])  # the condition cleared: no renewal
        assert again.stops_for(["r"])["r"] == renewed
        # a process started after the renewal is not asked to stop by it
        assert renewed.applies_to(renewed.at) and not renewed.applies_to(renewed.at + 1)
    finally:
        again.close()


def test_the_notification_says_the_run_was_asked_to_stop(tmp_path: Path) -> None:
    core = service(tmp_path, NAN_STOPS, {"exp-*": ["NonFiniteMetric"]})
    try:
        (fired,) = core.publish([step("exp-1", 0, math.nan)])
    finally:
        core.close()
    why = "rlmon asked run exp-1 to stop: rule NonFiniteMetric has the stop action"
    assert fired.stop.startswith(why) and "'exp-*'" in fired.stop
    slack = slack_body([fired], None, "rlmon")
    assert any(why in block["text"]["text"] for block in slack["blocks"]
               if block["type"] == "section")
    assert "asked to stop" in slack["text"]
    pd = pagerduty_body(fired, {"critical": "critical"}, "rlmon", None)
    assert pd["payload"]["custom_details"]["stop"] == fired.stop
    assert "asked to stop" in pd["payload"]["summary"]
    hook = webhook_body([fired], None)
    assert hook["alerts"][0]["stop"] == fired.stop
    lines: list[str] = []

    class Stream:
        def write(self, text: str) -> None:
            lines.append(text)

        def flush(self) -> None:
            pass

    ConsoleNotifier(Stream()).send(hook)  # type: ignore[arg-type]
    assert why in "".join(lines)
    # a firing that stops nothing says nothing of the kind
    quiet = service(tmp_path / "other", "", {"*": ["*"]})
    try:
        (plain,) = quiet.publish([step("exp-1", 0, math.nan)])
    finally:
        quiet.close()
    assert plain.stop == "" and webhook_body([plain], None)["alerts"][0]["stop"] == ""
    assert "stop" not in pagerduty_body(plain, {}, "rlmon", None)["payload"]["custom_details"]


# -- reaching the Reporter ----------------------------------------------------------------------

@pytest.mark.parametrize("node_merge", [False, True])
def test_a_stop_reaches_the_reporter_through_the_aggregator(tmp_path: Path,
                                                            node_merge: bool) -> None:
    core = service(tmp_path, NAN_STOPS, {"exp-*": ["NonFiniteMetric"]})
    path = InProcess(core, node_merge=node_merge)
    rep = Reporter("exp-1", "actor", rank={}, world={}, sink=path, step_seconds=False)
    other = Reporter("other", "actor", rank={}, world={}, sink=path, step_seconds=False)
    try:
        for n, value in enumerate((1.0, 1.0, math.nan)):
            for r in (rep, other):
                r.record(catalog.REWARD, sum=value, count=1)
                r.end_step(n)
        assert rep.flush(PATIENCE_S) and other.flush(PATIENCE_S)
        # the ack of the faulty step left before the service saw the step
        assert not rep.should_stop() and rep.stop_decision is None
        wait_for(lambda: path.knows_stop("exp-1"), PATIENCE_S, "the aggregator to learn the stop")
        rep.record(catalog.REWARD, sum=1.0, count=1)
        rep.end_step(3)
        if node_merge:  # the node merger learns it from the root with the next batch...
            assert rep.flush(PATIENCE_S)
            rep.record(catalog.REWARD, sum=1.0, count=1)
            rep.end_step(4)
        assert rep.flush(PATIENCE_S)  # ... and every reporter of the run from its next ack
        assert rep.should_stop()
        assert rep.stop_decision is not None and rep.stop_decision.alert == "NonFiniteMetric"
        assert rep.stop_decision.step == 2 and "NaN" in rep.stop_decision.reason
        other.record(catalog.REWARD, sum=1.0, count=1)
        other.end_step(3)
        assert other.flush(PATIENCE_S) and not other.should_stop()  # another run is not stopped
        # a Reporter started after the decision (the run resumed once someone looked) runs on
        later = Reporter("exp-1", "actor", rank={}, world={}, sink=path, step_seconds=False)
        later._delivery.started = core.stops_for(["exp-1"])["exp-1"].at + 1.0  # clocks are not exact
        later.record(catalog.REWARD, sum=1.0, count=1)
        later.end_step(10)
        assert later.flush(PATIENCE_S) and not later.should_stop()
        later.close()
    finally:
        rep.close()
        other.close()
        path.close()
        core.close()


def test_should_stop_answers_while_the_sender_is_stuck() -> None:
    """The training thread reads an attribute: a sink that never answers cannot hold it."""
    entered, release = threading.Event(), threading.Event()

    class Stuck:
        def send(self, messages: Sequence[StepMessage]) -> None:
            entered.set()
            release.wait(30)

    rep = Reporter("exp-1", "actor", rank={}, world={}, sink=Stuck(), step_seconds=False)
    try:
        rep.record(catalog.REWARD, sum=1.0, count=1)
        rep.end_step(0)
        assert entered.wait(PATIENCE_S)
        assert rep.should_stop() is False  # the sender thread is inside send()
        decision = StopDecision("exp-1", "actor", 0, "A", "why", "*", rep._delivery.started + 1)
        rep._delivery._retain([], type("Ack", (), {"stops": {"exp-1": decision}})())
        assert rep.should_stop() and rep.stop_decision == decision
    finally:
        release.set()
        rep.close(timeout=1.0)


@pytest.mark.ray
def test_a_stop_reaches_the_reporter_on_ray(ray_namespace: str, tmp_path: Path) -> None:
    """The same path through the real actors: the service actor answers the aggregator's
    publish with the decision, the aggregator puts it in the Reporter's next ack."""
    from rlmon.actors.runtime import RuntimeOptions, ensure_runtime, shutdown_runtime

    (tmp_path / "rules.yaml").write_text(NAN_STOPS)
    (tmp_path / "rlmon.yaml").write_text(
        "notifiers: {console: {enabled: false}}\nstop: {runs: [{run: 'ray-*', rules: ['*']}]}\n")
    opts = RuntimeOptions(config=str(tmp_path / "rlmon.yaml"), rules=str(tmp_path / "rules.yaml"),
                          state_dir=str(tmp_path / "state"), port=0)
    # the runtime is up before the first step (its start-up under load is not what is tested)
    ensure_runtime(ray_namespace, opts)
    rep = Reporter("ray-1", "actor", rank={}, world={}, namespace=ray_namespace, runtime=opts,
                   step_seconds=False)
    try:
        for n, value in enumerate((1.0, math.nan)):
            rep.record(catalog.REWARD, sum=value, count=1)
            rep.end_step(n)

        steps = itertools.count(2)

        def stopped() -> bool:  # every further step's ack may carry the decision
            rep.record(catalog.REWARD, sum=1.0, count=1)
            rep.end_step(next(steps))
            assert rep.flush(PATIENCE_S), rep.last_error
            return rep.should_stop()

        wait_for(stopped, PATIENCE_S, "the stop decision in an ack", every=0.1)
        assert rep.stop_decision is not None
        assert (rep.stop_decision.alert, rep.stop_decision.allowed_by) == ("NonFiniteMetric",
                                                                           "ray-*")
    finally:
        rep.close()
        shutdown_runtime(ray_namespace)
