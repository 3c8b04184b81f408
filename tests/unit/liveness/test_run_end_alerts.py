"""A run's alerts end with the run: a finished run's firing alerts close once, with the reason; a
failed run keeps its failure; `rlmon alerts` says how a finished run ended."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlmon.cli import main
from rlmon.service.alerting.notify.render import summary_line
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.liveness.run_state import LivenessView, RunState
from rlmon.service.metrics.rank import Rank
from rlmon.service.service_core import ServiceCore
from tests.unit.liveness.support import T0, sim_clock
from tests.unit.liveness.test_service_liveness import _settings


def _step(run: str, step: int, missing: bool) -> StepRecord:
    return StepRecord(run, "actor", step, not missing, 2, 1 if missing else 2,
                      (Rank(dp=1),) if missing else (), {"actor/loss": 1.0},
                      finalized_at=T0 + step, time=T0 + step)


def _view(run: str, state: RunState, at: float, last: int, how: str = "") -> LivenessView:
    return LivenessView(run, "actor", state, at, at, last, T0 + last, at - 1, 1.0, 90.0, 2,
                        heartbeats=True, ended_how=how, total_steps=30)


def test_a_finished_run_closes_its_firing_alerts_once_with_the_reason(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    service = ServiceCore(_settings(), state_dir=tmp_path / "state", clock=sim_clock())
    fired = service.publish([_step("r", s, missing=s >= 20) for s in range(30)]
                            + [_step("f", s, missing=s >= 20) for s in range(30)])
    assert {(e.run, e.alert, e.state) for e in fired} == {("r", "RankMissing", "firing"),
                                                         ("f", "RankMissing", "firing")}
    how = "its driver ended normally and Ray ended its actor with it (Ray: OWNER_DIED)"
    events = service.liveness([_view("r", RunState.FINISHED, T0 + 40, 29, how),
                               _view("f", RunState.FAILED, T0 + 40, 29)])
    closed = [(e.run, e.alert, e.state, e.ended_with_run, summary_line(e)) for e in events
              if e.alert == "RankMissing"]
    # the run is over, not the condition: never "resolved" where it is read
    assert closed == [("r", "RankMissing", "resolved", True,
                       "[CRITICAL, still firing when the run ended] RankMissing on r/actor step 29: "
                       "ranks_reporting (a step finalized without every expected rank) "
                       "[lasted 21 s: 2 GPUs, 0.0117 GPU-hours]")]
    stored = [(a["run"], a["state"], a["ended_with_run"])
              for a in service.history.alerts(cost=True) if a["alert"] == "RankMissing"]
    assert sorted(stored) == [("f", "firing", 0), ("r", "firing", 0), ("r", "resolved", 1)]
    # once: a later view of the same finished run closes nothing more
    assert [e for e in service.liveness([_view("r", RunState.FINISHED, T0 + 50, 29, how)])
            if e.alert == "RankMissing"] == []
    firing = {(a["run"], a["alert"]) for a in service.history.firing_alerts()}
    assert ("r", "RankMissing") not in firing and ("f", "RankMissing") in firing
    service.close(0.0)
    assert main(["alerts", "--state-dir", str(tmp_path / "state"), "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert [(r["run"], r["state"], r["detail"]) for r in found["finished"]] == [
        ("r", "finished", f"Finished at step 29, the last of 30 planned steps: {how}")]
    assert main(["alerts", "--state-dir", str(tmp_path / "state")]) == 0
    out = capsys.readouterr().out
    assert "runs that finished" in out
    assert "firing when the run ended" in out  # the closing, in the recent transitions
