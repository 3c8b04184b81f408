"""``rlmon alerts``: firing and recent alerts and the runs asked to stop, from a history store the
service wrote (a table for people, one JSON object for scripts)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from rlmon.cli import main
from rlmon.service.alerting.rules import parse_rules
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.metrics import catalog
from rlmon.service.service_core import ServiceCore
from tests.support.records import step_record
from tests.support.stop_support import stopping_settings


def step(run: str, n: int, at: float, **metrics: float) -> StepRecord:
    return step_record(run=run, step=n, metrics=metrics, finalized_at=at)


@pytest.fixture
def state(tmp_path: Path) -> Path:
    """Run a: IS ratio fired at step 0 and resolved at 1, NaN fired (and stopped it) at 2.
    Run b: IS ratio fires at step 0 and still fires. (ISRatioDivergence resolves at the first
    good step here, without the pack's hysteresis.)"""
    core = ServiceCore(stopping_settings({"a": ["NonFiniteMetric"]}), state_dir=tmp_path,
                       rules=parse_rules("actions: {NonFiniteMetric: [stop]}\nrules:\n"
                                         "  - {name: ISRatioDivergence, resolve_after: 1}\n"))
    core.publish([step("a", 0, 100.0, **{catalog.IS_RATIO: 3.0})])
    core.publish([step("a", 1, 110.0, **{catalog.IS_RATIO: 1.0})])
    core.publish([step("a", 2, 120.0, **{catalog.IS_RATIO: 1.0, catalog.REWARD: math.nan})])
    core.publish([step("b", 0, 130.0, **{catalog.IS_RATIO: 3.0})])
    core.close()
    return tmp_path


def alerts(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["alerts", *args])
    return code, capsys.readouterr().out


def test_json_lists_firing_recent_and_stops(state: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    code, out = alerts(capsys, "--state-dir", str(state), "--json")
    assert code == 0
    found = json.loads(out)
    assert [(a["run"], a["alert"], a["step"], a["severity"]) for a in found["firing"]] == [
        ("a", "NonFiniteMetric", 2, "critical"), ("b", "ISRatioDivergence", 0, "critical")]
    nan = found["firing"][0]
    assert (nan["metric"], nan["value"], nan["time"], nan["state"]) == (
        catalog.REWARD, None, 120.0, "firing")  # NaN is stored as null
    assert [(a["run"], a["alert"], a["state"], a["step"]) for a in found["recent"]] == [
        ("b", "ISRatioDivergence", "firing", 0), ("a", "NonFiniteMetric", "firing", 2),
        ("a", "ISRatioDivergence", "resolved", 1), ("a", "ISRatioDivergence", "firing", 0)]
    assert found["recent"][2]["value"] == 1.0 and found["recent"][2]["time"] == 110.0
    (stop,) = found["stops"]
    assert (stop["run"], stop["alert"], stop["step"], stop["allowed_by"]) == (
        "a", "NonFiniteMetric", 2, "a")


def test_filters_by_run_firing_and_limit(state: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, out = alerts(capsys, "--state-dir", str(state), "--json", "--run", "a", "--firing")
    found = json.loads(out)
    assert set(found) == {"firing", "stops", "liveness"}
    assert [a["alert"] for a in found["firing"]] == ["NonFiniteMetric"]
    _, out = alerts(capsys, "--state-dir", str(state), "--json", "--run", "b", "--limit", "1")
    found = json.loads(out)
    assert [a["run"] for a in found["recent"]] == ["b"] and found["stops"] == []


def test_table_for_people(state: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = alerts(capsys, "--state-dir", str(state))
    assert code == 0
    firing, rest = out.split("recent transitions")
    assert "NonFiniteMetric" in firing and "ISRatioDivergence" in firing
    assert "resolved" in rest and "1970-01-01 00:01:50Z" in rest  # step 1's finalization
    stops = rest.split("runs asked to stop")[1]
    assert "NonFiniteMetric" in stops and "rollout/reward = NaN" in stops


def test_no_store_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["alerts", "--state-dir", str(tmp_path)]) == 2
    assert "no history store" in capsys.readouterr().err


def test_a_run_the_store_does_not_hold_is_named_with_the_runs_it_does(
        state: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A typo in a run name is an error listing the runs, not an empty "no alert firing"; the
    same for rlmon samples and rlmon trace."""
    assert main(["alerts", "--state-dir", str(state), "--run", "grpo-7b"]) == 1
    err = capsys.readouterr().err
    assert "no run 'grpo-7b'" in err and "latest first: b, a" in err
    assert main(["samples", "grpo-7b", "--state-dir", str(state)]) == 1
    assert "rlmon samples: no run 'grpo-7b'" in capsys.readouterr().err
    assert main(["trace", "grpo-7b", "--state-dir", str(state), "-o",
                 str(state / "t.pftrace")]) == 1
    assert "rlmon trace: no run 'grpo-7b'" in capsys.readouterr().err
    assert main(["samples", "a", "--alert", "NonFinite", "--state-dir", str(state)]) == 1
    assert "(alerts that fired there: ISRatioDivergence, NonFiniteMetric)" in \
        capsys.readouterr().err


def test_an_early_warning_handed_over_to_its_level_rule_is_not_listed_resolved(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The entropy of the example run collapses in three steps: EntropySliding's closing is
    listed as handed over to EntropyCollapse, which fires, not as a recovery."""
    from dataclasses import replace

    from rlmon.service.config import load_config
    from tests.support.web_support import example_records

    records = example_records()
    last = next(r for r in records if r.role == "actor" and r.step == 29)
    collapsed = [replace(last, step=s, metrics={**last.metrics, catalog.ENTROPY: 0.001})
                 for s in (30, 31, 32)]
    core = ServiceCore(load_config(None), state_dir=tmp_path)
    core.publish(records + collapsed)
    core.close()
    code, out = alerts(capsys, "--state-dir", str(tmp_path), "--json")
    assert code == 0
    (handed,) = [a for a in json.loads(out)["recent"]
                 if a["alert"] == "EntropySliding" and a["state"] == "resolved"]
    assert (handed["step"], handed["handed_to"]) == (32, "EntropyCollapse")
    code, out = alerts(capsys, "--state-dir", str(tmp_path), "--limit", "100")
    rows = [line for line in out.splitlines() if "EntropySliding" in line]
    assert any("handed over to" in line for line in rows), out
    assert not any("resolved" in line for line in rows), out
