"""``rlmon demo`` end to end in a subprocess (it starts its own local Ray, as `make demo` does)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlmon.service.replay import replay
from rlmon.workload import grpo
from tests.support.perfetto_check import read_trace
from tests.support.polling import CHILD_RUN_S

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_demo_dead_rank_json_and_plot(tmp_path: Path) -> None:
    plot = tmp_path / "demo.png"
    env = {**os.environ, "RAY_DISABLE_USAGE_STATS": "1", "RAY_AUTH_MODE": "disabled"}
    proc = subprocess.run(
        [sys.executable, "-m", "rlmon.cli", "demo", "--steps", "5", "--fault", "dead_rank",
         "--fault-step", "2", "--port", "0", "--plot", str(plot), "--json",
         "--state-dir", str(tmp_path / "state")],
        capture_output=True, text=True, timeout=CHILD_RUN_S, env=env, cwd=tmp_path,
        stdin=subprocess.DEVNULL,  # no terminal: the demo does not wait for Ctrl-C
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    actor = {s["step"]: s for s in lines if s.get("type") == "step" and s["role"] == "actor"}
    assert sorted(actor) == [0, 1, 2, 3, 4]
    assert [actor[s]["ranks_reporting"] for s in range(5)] == [4, 4, 3, 3, 3]
    assert actor[2]["missing_ranks"] == [{"dp": 1, "cp": 1, "tp": 0, "pp": 0}]
    alerts = [a for a in lines if a.get("type") == "alert"]
    assert any(a["alert"] == "RankMissing" and a["step"] == 2 for a in alerts)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the trace beside the plot, read with Perfetto's own proto classes
    assert f"trace written to {tmp_path / 'demo.pftrace'}" in proc.stderr
    assert "ui.perfetto.dev" in proc.stderr
    view = read_trace((tmp_path / "demo.pftrace").read_bytes())
    actor = {name: slices for (process, name), slices in view.slices.items()
             if process.startswith("actor @ ")}
    assert len(actor) == 4  # one thread per rank
    dead = actor["rank dp=1 cp=1 tp=0 pp=0"]
    assert [s.name for s in dead if s.depth == 0] == ["step 0", "step 1"]  # then it died
    live = actor["rank dp=0 cp=0 tp=0 pp=0"]
    assert [s.name for s in live if s.depth == 0] == [f"step {n}" for n in range(5)]
    assert any(s.name == "train" and s.depth == 1 for s in live)  # the demo's spans, nested
    instants = [i for (process, track), items in view.instants.items()
                if process == "actor: run" for i in items]
    assert any(name == "RankMissing firing" for _, name, _ in instants)


def test_demo_lr_spike_computes_what_the_workload_does(tmp_path: Path) -> None:
    """The Ray job (ranks, rollout and reward actors, the driver's all-reduce) gives exactly the
    numbers of the in-process workload, so the alert sets pinned in test_demo_workload hold live:
    ClipRatioHigh, and nothing else, on the third spiked step (closed when the run ends)."""
    env = {**os.environ, "RAY_DISABLE_USAGE_STATS": "1", "RAY_AUTH_MODE": "disabled"}
    proc = subprocess.run(
        [sys.executable, "-m", "rlmon.cli", "demo", "--steps", "7", "--fault", "lr_spike",
         "--fault-step", "3", "--port", "0", "--plot", str(tmp_path / "demo.png"), "--json",
         "--state-dir", str(tmp_path / "state")],
        capture_output=True, text=True, timeout=CHILD_RUN_S, env=env, cwd=tmp_path,
        stdin=subprocess.DEVNULL,  # no terminal: the demo does not wait for Ctrl-C
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    alerts = [(a["alert"], a["state"], a["step"]) for a in lines if a.get("type") == "alert"]
    # ... closed with the run, which ended at step 6 with it firing (issue 38)
    assert alerts == [("ClipRatioHigh", "firing", 5), ("ClipRatioHigh", "resolved", 6)]
    live = {s["step"]: s["metrics"] for s in lines if s.get("type") == "step"
            and s["role"] == "actor"}
    records = grpo.simulate(steps=7, fault="lr_spike", fault_step=3)
    offline = {rec.step: rec.metrics for rec, _ in replay([json.dumps(r) for r in records]).steps
               if rec.role == "actor"}
    assert sorted(live) == sorted(offline) == list(range(7))
    for step in range(7):
        for name in ("actor/clip_ratio", "actor/loss", "actor/kl", "actor/lr", "actor/grad_norm"):
            assert live[step][name] == pytest.approx(offline[step][name], rel=1e-9), (step, name)


def test_demo_replay_mode() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "rlmon.cli", "demo", "--replay", "--json"],
        capture_output=True, text=True, timeout=CHILD_RUN_S,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    alerts = [json.loads(x) for x in proc.stdout.splitlines() if '"type": "alert"' in x]
    # the bundled run is the default demo: the rollout stops receiving weights at step 3
    assert {(a["alert"], a["state"]) for a in alerts} == {
        ("LogprobMismatch", "firing"), ("ISRatioStale", "firing"), ("PolicyLagGrowing", "firing")}
