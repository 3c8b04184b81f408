"""Key maps: every row names a real catalog metric, and `rlmon catalog --framework` prints them."""

from __future__ import annotations

import json

import pytest

from rlmon.cli import main
from rlmon.service.generated import all_artifacts
from rlmon.service.metrics import catalog, keymaps
from tests.support.clock import FakeClock
from tests.support.paths import REPO


@pytest.mark.parametrize("framework", keymaps.FRAMEWORKS)
def test_rows_are_consistent(framework: str) -> None:
    rows = list(keymaps.mappings(framework))
    assert rows, framework
    for row in rows:
        if row.canonical is not None:
            assert catalog.lookup(row.canonical) is not None
        if not row.comparable:
            assert row.note, f"{row.key}: a non-comparable key must say why"
            assert keymaps.canonical(framework, row.key) is None


def test_lossy_reductions_are_not_published_under_canonical_names() -> None:
    assert keymaps.canonical("openrlhf", "policy_loss") is None
    assert keymaps.canonical("openrlhf", "ppo_clip_ratio") == "actor/clip_ratio"
    assert keymaps.canonical("trl", "sampling/importance_sampling_ratio/mean") is None
    assert keymaps.canonical("verl", "actor/pg_clipfrac") is None
    assert keymaps.relay_name("verl", "actor/pg_loss") == "verl/actor/pg_loss"
    with pytest.raises(KeyError, match="unknown framework"):
        list(keymaps.mappings("megatron"))


@pytest.mark.parametrize("framework", ["openrlhf", "skyrl", "verl", "trl"])
def test_cli_prints_json(framework: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["catalog", "--framework", framework, "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["framework"] for r in rows} == {framework}
    assert all(r["rlmon"] in ("exact", "recomputed", "relayed") for r in rows)
    assert len(rows) == len(list(keymaps.mappings(framework)))


def test_cli_table_and_markdown(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["catalog", "--framework", "skyrl", "--format", "markdown"]) == 0
    out = capsys.readouterr().out
    assert "`policy/policy_loss`" in out and "sum over micro-batches and DP" in out
    assert main(["catalog", "--framework", "openrlhf"]) == 0
    assert "ppo_clip_ratio" in capsys.readouterr().out


def test_matrix_marks_best_fidelity() -> None:
    matrix = keymaps.fidelity_matrix()
    assert matrix["actor/is_ratio"]["openrlhf"] is keymaps.Fidelity.EXACT  # driver hook
    assert matrix["actor/loss"]["skyrl"] is keymaps.Fidelity.RECOMPUTED
    assert matrix["actor/loss"]["verl"] is keymaps.Fidelity.RELAYED
    assert matrix["rollout/prefix_cache_hit_rate"]["vllm"] is keymaps.Fidelity.RECOMPUTED
    table = keymaps.matrix_markdown()
    assert table.count("\n") == 2 + len(matrix)


def test_docs_framework_table_is_fresh() -> None:

    root = REPO
    mine = [a for a in all_artifacts() if a.block == "frameworks"]
    assert len(mine) == 1
    current = (root / mine[0].path).read_text(encoding="utf-8")
    assert mine[0].expected(current) == current, "run `rlmon generate`"


# --- claims against code: each row's fidelity must be what the integration actually does ------

RELAY_PATHS = {"logger", "tracker", "callback"}  # these forward the framework's number as is
# Framework reductions that a relay may call exact, by the canonical metric's form: a max/min
# survives only a max/min or an already-global value; a mean survives no mean of means.
_EXTREMA_OK = {keymaps.Reduction.MAX, keymaps.Reduction.MIN, keymaps.Reduction.DRIVER_EXACT,
               keymaps.Reduction.GLOBAL_VALUE}
_LOSSY = {keymaps.Reduction.MEAN_OF_MEANS, keymaps.Reduction.MEAN_OF_RANK_MEANS,
          keymaps.Reduction.WINDOW_NORMALIZED, keymaps.Reduction.SUM_MINIBATCHES,
          keymaps.Reduction.SUM_DP_MEAN_MINIBATCH, keymaps.Reduction.LOSS_SCALED_BY_GAS}
# TRL's GRPOTrainer.log averages every collected list over the logging window (grpo_trainer.py),
# whatever the key's per-batch reduction: no extremum it logs is the window's extremum.
WINDOW_AVERAGED = {"trl"}
# Paths that need the framework running: their rows are checked against it in the extras venv.
# TRL's trainer hooks (RlmonCallback.attach on a GRPOTrainer): test_integrations_trl_trainer.py
# compares every value they publish with the token-weighted truth of a real run.
CHECKED_AGAINST_RUNNING_FRAMEWORK = {("trl", "trainer hook")}
# A note that admits a lossy reduction contradicts an exact relay.
_ADMITS_LOSS = ("mean of micro-batch means", "mean of maxima", "mean of per-batch maxima")


class Recorder:
    """A ReporterLike that keeps the names recorded (no aggregation needed to check claims)."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def record(self, name: str, **stat: object) -> None:
        self.names.add(name)

    def record_tensor(self, name: str, values: object, mask: object = None, **kw: object) -> None:
        self.names.add(name)

    def record_sample_tensor(self, name: str, values: object, mask: object = None,
                             **kw: object) -> None:
        self.names.add(name)

    def end_micro_batch(self) -> None: ...

    def end_step(self, step: int) -> None: ...

    def flush(self, timeout: float | None = None) -> bool:
        return True

    def close(self) -> None: ...


def _emitted_by_paths() -> dict[tuple[str, str], set[str]]:
    """Run every non-relay path of every integration once; the canonical names each emits."""
    from types import SimpleNamespace as NS

    import numpy as np

    from rlmon.actors.integrations import deepspeed, openrlhf, skyrl, vllm

    mask = np.array([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    tok = np.array([[0.5, 1.5, 9.0], [2.0, 9.0, 9.0]])
    out: dict[tuple[str, str], set[str]] = {}

    rec = Recorder()
    wp = openrlhf.WorkerPath("r", dp_rank=0, dp_size=1, reporter=rec)
    wp.micro_batch(mask, policy_loss=tok, entropy=tok, clipped=tok, approx_kl=tok, kl=tok)
    wp.optimizer_step(0, grad_norm=1.0, lr=1e-6)
    wp.end_step(1)
    out["openrlhf", "worker path"] = rec.names

    rec = Recorder()
    logger = openrlhf.RlmonLogger("r", reporter=rec)
    logger.record_experiences([NS(action_log_probs=-tok, rollout_log_probs=-tok / 2,
                                  action_mask=mask)])
    out["openrlhf", "driver hook"] = rec.names

    rec = Recorder()
    sk = skyrl.WorkerPath("r", reporter=rec)
    sk.micro_batch(mask, minibatch=0, per_token_loss=tok, entropy=tok, kl=tok, clipped=tok,
                   is_ratio=tok)
    sk.optimizer_step(0, grad_norm=1.0)
    out["skyrl", "worker path"] = rec.names

    rec = Recorder()
    clock = FakeClock(0.0)  # two iterations a second apart: a throughput needs a span
    window = vllm.EngineWindow(rec, 10.0, clock)
    for _ in range(2):
        window.record(NS(num_running_reqs=1, num_waiting_reqs=1, kv_cache_usage=0.5,
                         prefix_cache_stats=NS(queries=4, hits=1)),
                      NS(num_generation_tokens=3, num_preempted_reqs=1))
        clock.advance(1.0)
    window.close_window()
    out["vllm", "stat logger"] = rec.names

    class Engine:  # the DeepSpeedEngine surface the probe reads
        optimizer = NS(cur_scale=1024.0)
        skipped_steps, global_steps = 0, 1

        def fp16_enabled(self) -> bool:
            return True

        def get_global_grad_norm(self) -> float:
            return 1.0

        def gradient_accumulation_steps(self) -> int:
            return 4

        def zero_optimization_stage(self) -> int:
            return 2

    rec = Recorder()
    deepspeed.EngineProbe(Engine(), reporter=rec).record(1, loss=2.0)
    out["deepspeed", "engine probe"] = rec.names
    return out


def test_every_fidelity_claim_matches_what_the_integration_does() -> None:
    """exact/recomputed rows on a computing path are emitted by that path; rows on a relay path
    are never 'recomputed' (a relay rebuilds nothing), and 'exact' only where the framework's
    own reduction keeps the canonical meaning; relays publish canonical iff comparable."""
    from rlmon.actors.integrations._base import relay

    emitted = _emitted_by_paths()
    wrong = []
    for row in keymaps.mappings():
        claim = f"{row.framework} {row.key!r} ({row.fidelity.value} via {row.via})"
        if row.via in RELAY_PATHS:
            if row.fidelity is keymaps.Fidelity.RECOMPUTED:
                wrong.append(f"{claim}: a relay cannot recompute")
            if row.fidelity is keymaps.Fidelity.EXACT and row.canonical:
                form = catalog.get(row.canonical).forms[0].value
                if not row.comparable:
                    wrong.append(f"{claim}: exact but not comparable")
                elif form in ("max", "min") and row.reduction not in _EXTREMA_OK:
                    wrong.append(f"{claim}: a {form} survives no {row.reduction.value}")
                elif form in ("max", "min") and row.framework in WINDOW_AVERAGED:
                    wrong.append(f"{claim}: {row.framework} averages it over the window")
                elif any(phrase in row.note for phrase in _ADMITS_LOSS):
                    wrong.append(f"{claim}: the note admits a lossy reduction")
                elif row.reduction in _LOSSY:
                    wrong.append(f"{claim}: {row.reduction.value} is lossy")
            if row.canonical and not row.key.startswith("("):
                rec = Recorder()
                published = relay(rec, row.framework, {row.key: 1.0})[row.key]
                want = row.canonical if row.comparable else keymaps.relay_name(row.framework,
                                                                               row.key)
                if published != want:
                    wrong.append(f"{claim}: relay publishes {published}, claim says {want}")
        elif (row.framework, row.via) in CHECKED_AGAINST_RUNNING_FRAMEWORK:
            continue
        elif row.fidelity is not keymaps.Fidelity.RELAYED and row.canonical:
            names = emitted.get((row.framework, row.via))
            if names is None or row.canonical not in names:
                wrong.append(f"{claim}: the {row.via} does not emit {row.canonical}")
    assert not wrong, "\n".join(wrong)
