"""GRPOTrainer on two processes (torchrun, gloo on CPU) with rlmon's callback: only rank 0
reports, and what it reports equals the token-weighted truth pooled over both ranks' micro-batches
(TRL's ``accelerator.reduce`` makes the (sum, count) pairs global)."""

from __future__ import annotations

import os
import pickle
import shutil
import sys
from pathlib import Path

import pytest

from rlmon.service.metrics import catalog
from rlmon.service.replay import replay
from tests.support.extras import optional_import
from tests.support.paths import REPO, SUPPORT
from tests.support.subprocesses import run_in_own_session

pytestmark = [pytest.mark.trl, pytest.mark.slow]

ROOT = REPO
LOSS_TRUTH = {catalog.KL: "kl", catalog.ENTROPY: "entropy",
              catalog.CLIP_RATIO: "clip_ratio/region_mean"}


def test_two_ranks_pool_to_the_truth(tmp_path: Path) -> None:
    optional_import("trl")
    from tests.support.trl_support import Truth, close, tiny_model

    model_dir, tok_dir = tiny_model()
    tiny = tmp_path / "tiny"
    shutil.copytree(model_dir, tiny / "model")
    shutil.copytree(tok_dir, tiny / "tokenizer")
    sink = tmp_path / "run.jsonl"
    env = {**os.environ, "RLMON_SINK_JSONL": str(sink),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
    # A session of its own, so a timeout takes torchrun's workers down with it.
    proc = run_in_own_session(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(SUPPORT / "trl_ddp_worker.py"), str(tiny), str(tmp_path)],
        timeout=400, cwd=tmp_path, env=env)
    stderr = proc.stderr
    assert proc.returncode == 0, stderr[-4000:]
    ranks = [pickle.loads((tmp_path / f"rank{r}.pkl").read_bytes()) for r in (0, 1)]
    assert [r["world"] for r in ranks] == [2, 2] and ranks[0]["fallbacks"] == 0
    truth = Truth(num_generations=4, eps_low=0.05, eps_high=0.05,
                  kl_times_ratio=ranks[0]["kl_times_ratio"])
    for r in ranks:
        truth.micro += r["micro"]
        truth.generations += r["generations"]
    loss, rollout = truth.loss_truth(), truth.rollout_truth()
    logged: dict[int, dict[str, float]] = {}
    for entry in ranks[0]["log_history"]:
        logged.setdefault(int(entry["step"]), {}).update(entry)
    result = replay(sink.read_text().splitlines())
    assert not result.errors
    assert [rec.step for rec, _ in result.steps] == [1, 2, 3, 4]
    compared = differ = trl_off = 0
    for rec, _ in result.steps:
        assert rec.ranks_expected == 1 and rec.complete  # one reporter: rank 0
        assert {m.step for m in truth.micro if m.step == rec.step} and sum(
            1 for m in truth.micro if m.step == rec.step) == 4  # 2 ranks x 2 micro-batches
        want = dict(rollout.get(rec.step, {}))
        want.update({name: loss[rec.step][key] for name, key in LOSS_TRUTH.items()})
        for name, value in want.items():
            if name in rec.metrics:
                compared += 1
                differ += not close(rec.metrics[name], value)
        trl_off += sum(not close(logged[rec.step][key], loss[rec.step][key])
                       for key in LOSS_TRUTH.values())
    print(f"\nTRL GRPOTrainer on 2 processes, 4 steps: {compared} (step, key) values compared "
          f"with the pooled truth, {differ} differing; TRL's logged kl/entropy/clip_ratio off "
          f"the truth at {trl_off} of {3 * len(result.steps)}")
    assert compared >= 3 * 4 + 8 * 2 and differ == 0
