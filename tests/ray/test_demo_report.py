"""``rlmon demo`` ends by writing its run report: the goodput in it adds up to the stored
timelines of every rank, its wasted generation to the tied groups the reward worker reported,
and each alert's cost to the run's GPUs times the time since the onset step began."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rlmon.service.metrics import catalog
from rlmon.service.storage.history import HistoryStore
from tests.support.polling import CHILD_RUN_S

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_demo_writes_a_report_consistent_with_its_timelines(tmp_path: Path) -> None:
    env = {**os.environ, "RAY_DISABLE_USAGE_STATS": "1", "RAY_AUTH_MODE": "disabled"}
    html = tmp_path / "run.html"
    proc = subprocess.run(
        [sys.executable, "-m", "rlmon.cli", "demo", "--steps", "10", "--fault", "stale_weights",
         "--fault-step", "1", "--port", "0", "--plot", str(tmp_path / "demo.png"),
         "--report", str(html), "--json", "--state-dir", str(tmp_path / "state")],
        capture_output=True, text=True, timeout=CHILD_RUN_S, env=env, cwd=tmp_path,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = re.search(r"report written to (\S+): goodput ([0-9.]+) % of .*\(rlmon report (\S+) "
                     r"--state-dir (\S+)\)", proc.stderr)
    assert said is not None, proc.stderr[-2000:]
    assert Path(said.group(1)) == html and html.read_text().startswith("<!DOCTYPE html>")
    run, state = said.group(3), Path(said.group(4))
    assert state == tmp_path / "state"  # where it was asked to keep it, and said so
    out = subprocess.run([sys.executable, "-m", "rlmon.cli", "report", run, "--state-dir",
                          str(state), "--json"], capture_output=True, text=True, timeout=CHILD_RUN_S,
                         env=env, check=True)
    report = json.loads(out.stdout)
    assert 100 * report["goodput_ratio"] == pytest.approx(float(said.group(2)), abs=0.051)

    store = HistoryStore(state / "history.sqlite")
    try:
        stored = store.timelines(run)
        lines = store.steps(run)
        alerts = [a for a in store.alerts(run, cost=True) if a["state"] == "firing"]
    finally:
        store.close()
    # every rank's step time is in exactly one bucket (1 GPU per rank by default)
    ranks_time = sum(t.timeline.end_ns - t.timeline.start_ns for st in stored for t in st.ranks)
    span_time = sum(s.end_ns - s.start_ns for st in stored for t in st.ranks
                    for s in t.timeline.spans)  # the demo's spans do not nest
    buckets = report["goodput"]
    assert sum(buckets.values()) == pytest.approx(ranks_time * 1e-9, abs=1e-6)
    assert buckets["idle"] == pytest.approx((ranks_time - span_time) * 1e-9, abs=1e-6)
    assert buckets["productive"] + buckets["overhead"] + buckets["wasted"] == pytest.approx(
        span_time * 1e-9, abs=1e-6)
    # wasted generation: the rollout's generate spans times the reward worker's tied fraction
    tied = {line["step"]: line["metrics"][catalog.FRAC_REWARD_ZERO_STD] for line in lines
            if line["role"] == "reward"}
    generated = {st.step: sum(s.seconds for t in st.ranks for s in t.timeline.spans
                              if s.name == "generate") for st in stored if st.role == "rollout"}
    reasons = {(b, why): v for b, why, v in report["goodput_reasons"]}
    assert reasons.get(("wasted", "no_reward_spread"), 0.0) == pytest.approx(
        sum(generated[s] * tied.get(s, 0.0) for s in generated), abs=1e-6)
    assert report["steps_accounted"] == 10 and report["gpu_hours"] > 0
    # the demo ends well and quietly: every role finished at its last step, nothing paged for it
    ended = {s["role"]: (s["state"], s["last_step"]) for s in report["run_states"]}
    assert ended == {"actor": ("finished", 9), "rollout": ("finished", 9),
                     "reward": ("finished", 9)}, report["run_states"]
    assert all(s["detail"].startswith("Finished at step 9, the last of 10 planned steps")
               for s in report["run_states"]), report["run_states"]
    assert not [a for a in report["alerts"]
                if a["alert"] in ("RunDied", "RunStalled", "RunFailed", "RunPreempted")]
    # each alert's cost: the run's 6 GPUs (4 policy ranks, rollout, reward) since its onset,
    # the start of a step at or before the one that fired
    assert alerts and report["alerts"]
    starts = {(st.role, st.step): min(t.timeline.start_ns for t in st.ranks) * 1e-9
              for st in stored}
    finalized = {(line["role"], line["step"]) for line in lines}
    for alert in alerts:
        assert alert["gpus"] == 6 and alert["cost_note"]
        onsets = [s for (role, step), s in starts.items()
                  if role == alert["role"] and step <= alert["step"]]
        assert any(alert["onset"] == pytest.approx(s, abs=1e-6) for s in onsets)
        assert (alert["role"], alert["step"]) in finalized
        assert alert["gpu_hours"] > 0
    # the report: a resolved alert costs what its resolve said; one still firing at the end
    # costs the run's GPUs from its onset to the end of the run's last step
    end = max(t.timeline.end_ns for st in stored for t in st.ranks) * 1e-9
    # an escalation (issue 30: LogprobMismatch to critical past 0.3) is the same incident, not
    # a second alert: one entry per (role, alert, attempt) still firing, at its latest severity
    firing_keys = [(e["role"], e["alert"], e["attempt"]) for e in report["alerts"]
                   if e["resolved_step"] is None]
    assert len(firing_keys) == len(set(firing_keys)), report["alerts"]
    assert all(e["severity"] == "critical" for e in report["alerts"] if e["escalated_step"])
    for entry in report["alerts"]:
        if entry["resolved_step"] is None:
            assert entry["gpu_hours"] == pytest.approx(6 * (end - entry["onset"]) / 3600)
            assert entry["cost_note"].endswith("(to the run's last step)")
