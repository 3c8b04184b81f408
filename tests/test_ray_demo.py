"""``rlmon demo`` end to end in a subprocess (it starts its own local Ray, as `make demo` does)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_demo_dead_rank_json_and_plot(tmp_path: Path) -> None:
    plot = tmp_path / "demo.png"
    env = {**os.environ, "RAY_DISABLE_USAGE_STATS": "1", "RAY_AUTH_MODE": "disabled"}
    proc = subprocess.run(
        [sys.executable, "-m", "rlmon.cli", "demo", "--steps", "5", "--fault", "dead_rank",
         "--fault-step", "2", "--port", "0", "--plot", str(plot), "--json"],
        capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path,
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


def test_demo_replay_mode() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "rlmon.cli", "demo", "--replay", "--json"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    alerts = [json.loads(x) for x in proc.stdout.splitlines() if '"type": "alert"' in x]
    assert any(a["alert"] == "ISRatioDivergence" for a in alerts)
