"""``examples/vllm_offline.py`` run as a user runs it: a script of its own, in the extras venv,
reporting to the rlmon service it starts on a local Ray (the default), whose last step reaches
rlmon only through the exit hook (the script never calls close)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlmon.service.metrics import catalog
from rlmon.service.storage.history import HistoryStore
from tests.support.extras import optional_import
from tests.support.vllm_support import EXAMPLES

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.examples]

optional_import("vllm")


def test_vllm_offline_example_counts_every_token(tmp_path: Path) -> None:
    state = tmp_path / "state"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RLMON_", "RAY_ADDRESS"))}
    env.update(RLMON_STATE_DIR=str(state), RLMON_PORT="0", VLLM_CPU_KVCACHE_SPACE="1",
               RAY_DISABLE_USAGE_STATS="1")
    proc = subprocess.run([sys.executable, str(EXAMPLES / "vllm_offline.py"), "--steps", "3",
                           "--run", "example-offline"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=280, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    # vLLM logs to stdout too: the script's own line is the JSON object it prints last
    said = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith('{"run"')][-1])
    steps = HistoryStore(state / "history.sqlite").steps(run="example-offline", role="vllm")
    assert [(s["step"], s["complete"]) for s in steps] == [(0, True), (1, True), (2, True)]
    total = sum(s["metrics"][catalog.TOKENS] for s in steps)
    print(f"example (LLM, Ray, exit hook): rlmon {total:g}, vLLM vllm:generation_tokens "
          f"{said['vllm_generation_tokens']:g}, outputs {said['generated_tokens']}")
    assert total == said["vllm_generation_tokens"] == said["generated_tokens"] > 0
