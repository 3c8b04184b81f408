"""The run settings a log carries, and the scaling signatures they let the sanity layer see.

TensorBoard runs are written with TensorBoard's own event writer, one file per process as a
resumed run leaves them, each opening with its arguments as a JSON text summary (as the Hugging
Face callback writes ``args``); W&B runs by the W&B SDK offline with the run config a framework
passes to ``wandb.init`` (verl's). Each signature is tested on a faulty series and a healthy
one, which gives no such finding.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import subprocess
import sys
import zipfile
from pathlib import Path

from rlmon.service.diagnose.findings import diagnose
from rlmon.service.diagnose.formats import read_paths
from rlmon.service.diagnose.readers.training_args import read_training_args

SIGNATURES = {"ScaledByGradAccumulation", "ScaledByContextParallel", "TokensOverCounted"}


def sft_curves(steps: range, seed: int = 0) -> dict[int, dict[str, float]]:
    """An SFT run's Trainer logs: a slowly falling loss, a steady gradient norm."""
    rng = random.Random(seed)
    return {s: {"loss": 2.0 - 0.01 * s + 0.02 * rng.gauss(0, 1),
                "grad_norm": 1.0 + 0.05 * rng.random(),
                "learning_rate": 2e-5 * (1 - s / 50), "epoch": s / 40} for s in steps}


def write_segment(directory: Path, args: dict[str, object],
                  rows: dict[int, dict[str, float]]) -> None:
    """One process's event file: its arguments as text, then ``train/<key>`` scalars."""
    from tensorboard.compat.proto import event_pb2
    from tensorboard.plugins.scalar.summary_v2 import scalar_pb
    from tensorboard.plugins.text.summary_v2 import text_pb
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    writer = EventFileWriter(str(directory))
    first = min(rows)
    writer.add_event(event_pb2.Event(wall_time=1.0, step=first,
                                     summary=text_pb("args", json.dumps(args))))
    for step, values in rows.items():
        for key, value in values.items():
            writer.add_event(event_pb2.Event(wall_time=1.0 + step, step=step,
                                             summary=scalar_pb(f"train/{key}", value)))
    writer.close()


def hf_args(ga: int, **more: object) -> dict[str, object]:
    return {"output_dir": "out", "per_device_train_batch_size": 8, "learning_rate": 2e-5,
            "gradient_accumulation_steps": ga, "deepspeed": None, **more}


def resumed_run(tmp: Path, *, before: dict[str, object], after: dict[str, object],
                loss_factor: float = 1.0, grad_factor: float = 1.0) -> Path:
    """Steps 1-20 by one process, 21-40 by the resumed one (its values scaled as given)."""
    curves = sft_curves(range(1, 41))
    directory = tmp / "runs" / "sft"
    directory.mkdir(parents=True)
    write_segment(directory, before, {s: v for s, v in curves.items() if s <= 20})
    write_segment(directory, after, {
        s: {**v, "loss": v["loss"] * loss_factor, "grad_norm": v["grad_norm"] * grad_factor}
        for s, v in curves.items() if s > 20})
    return directory


def signatures(path: Path) -> list[tuple[str, int, str]]:
    (run,), problems = read_paths([path])
    assert problems == []
    return [(f.alert, f.step, f.key) for f in diagnose(run).findings if f.alert in SIGNATURES]


def test_tensorboard_settings_are_read_per_process(tmp_path: Path) -> None:
    resumed_run(tmp_path, before=hf_args(1), after=hf_args(4))
    (run,), _ = read_paths([tmp_path])
    assert [(s.first_step, s.settings.gradient_accumulation_steps) for s in run.segments] \
        == [(1, 1), (21, 4)]
    assert run.settings.per_device_batch_size == 8 and run.settings.deepspeed is False
    origin = dict(run.settings.origin)["gradient_accumulation_steps"]
    assert origin.endswith("text args: gradient_accumulation_steps"), origin


def test_a_loss_divided_by_the_new_ga_at_a_resume_is_found(tmp_path: Path) -> None:
    resumed_run(tmp_path, before=hf_args(1), after=hf_args(4), loss_factor=0.25)
    found = signatures(tmp_path)
    assert found == [("ScaledByGradAccumulation", 21, "train/loss")]
    (run,), _ = read_paths([tmp_path])
    finding = next(f for f in diagnose(run).findings if f.alert == "ScaledByGradAccumulation")
    assert finding.severity == "warning" and finding.source == "sanity"
    assert "gradient_accumulation_steps 1 -> 4" in finding.what_to_check
    assert "micro-batch" in finding.what_to_check


def test_a_ga_change_with_a_continuous_loss_gives_no_finding(tmp_path: Path) -> None:
    resumed_run(tmp_path, before=hf_args(1), after=hf_args(4))
    assert signatures(tmp_path) == []


def test_a_jump_without_a_settings_change_is_not_blamed_on_them(tmp_path: Path) -> None:
    resumed_run(tmp_path, before=hf_args(4), after=hf_args(4), loss_factor=0.25)
    assert signatures(tmp_path) == []


def test_a_grad_norm_summed_over_cp_ranks_is_found(tmp_path: Path) -> None:
    # a Megatron-style config written as the run's text summary
    before: dict[str, object] = {"context_parallel_size": 1, "micro_batch_size": 1}
    after: dict[str, object] = {"context_parallel_size": 2, "micro_batch_size": 1}
    resumed_run(tmp_path, before=before, after=after, grad_factor=2.0)
    assert signatures(tmp_path) == [("ScaledByContextParallel", 21, "train/grad_norm")]
    healthy = tmp_path / "healthy"
    resumed_run(healthy, before=before, after=after)
    assert signatures(healthy) == []


_WANDB_WRITER = """
import json, os, sys, wandb
spec = json.load(open(sys.argv[1]))
os.makedirs(spec["dir"], exist_ok=True)
# as verl's Tracking does: the resolved config at init, then wandb.log(data, step=step)
run = wandb.init(project="diagnose", mode="offline", name=spec["name"], dir=spec["dir"],
                 config=spec["config"])
for step, values in sorted(spec["rows"].items(), key=lambda kv: int(kv[0])):
    run.log(values, step=int(step))
run.finish()
"""

VERL_CONFIG = {
    "data": {"train_batch_size": 8, "max_prompt_length": 64, "max_response_length": 128},
    "actor_rollout_ref": {
        "rollout": {"n": 4},
        "actor": {"ppo_micro_batch_size_per_gpu": 2,
                  "megatron": {"context_parallel_size": 2, "tensor_model_parallel_size": 1}}},
    "critic": {"ppo_micro_batch_size_per_gpu": 4},
    "trainer": {"n_gpus_per_node": 4, "nnodes": 1, "logger": ["console", "wandb"]},
}


def verl_rows(token_factor: float) -> dict[str, dict[str, float]]:
    rng = random.Random(1)
    return {str(s): {"actor/entropy": 1.5 - 0.01 * s, "actor/grad_norm": 0.5 + 0.1 * rng.random(),
                     "actor/pg_loss": 0.01 * rng.gauss(0, 1), "critic/score/mean": 0.3 + 0.01 * s,
                     "perf/total_num_tokens": token_factor * 32 * (150 + rng.randint(-20, 20))}
            for s in range(1, 21)}


def write_wandb(tmp: Path, name: str, token_factor: float) -> Path:
    spec = {"name": name, "dir": str(tmp / name), "config": VERL_CONFIG,
            "rows": verl_rows(token_factor)}
    spec_file = tmp / f"{name}.json"
    spec_file.write_text(json.dumps(spec))
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true",
           "WANDB_DIR": str(tmp / name)}
    subprocess.run([sys.executable, "-c", _WANDB_WRITER, str(spec_file)], env=env, check=True,
                   timeout=120)
    return tmp / name


def test_wandb_config_gives_the_settings_and_tokens_counted_per_cp_rank(tmp_path: Path) -> None:
    faulty = write_wandb(tmp_path, "counted-twice", 2.0)
    healthy = write_wandb(tmp_path, "counted-once", 1.0)
    (run,), problems = read_paths([faulty])
    assert problems == [] and run.format == "wandb-offline"
    s = run.settings
    assert (s.samples_per_step, s.max_length, s.world_size, s.context_parallel,
            s.per_device_batch_size) == (32, 192, 4, 2, 2)
    assert dict(s.origin)["max_length"].endswith(
        "data.max_prompt_length + data.max_response_length")
    d = diagnose(run)
    assert d.keymap.framework == "verl"
    found = [f for f in d.findings if f.alert == "TokensOverCounted"]
    assert [(f.step, f.key) for f in found] == [(3, "perf/total_num_tokens")]
    assert "CP size 2" in found[0].what_to_check and "6144" in found[0].what_to_check
    assert signatures(healthy) == []


def test_training_args_are_read_without_running_the_pickle(tmp_path: Path) -> None:
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, (f"touch {marker}",))

    data = pickle.dumps({"gradient_accumulation_steps": 4, "per_device_train_batch_size": 2,
                         "hook": Payload(), "deepspeed": None}, protocol=2)
    path = tmp_path / "training_args.bin"
    with zipfile.ZipFile(path, "w") as archive:  # the layout torch.save writes
        archive.writestr("archive/data.pkl", data)
    fields = read_training_args(path)
    assert not marker.exists()
    assert fields["gradient_accumulation_steps"] == 4 and fields["deepspeed"] is None


def test_an_unreadable_training_args_is_said_and_the_state_still_read(tmp_path: Path) -> None:
    from transformers import TrainerState

    out = tmp_path / "checkpoint-10"
    out.mkdir()
    TrainerState(global_step=10, log_history=[
        {"loss": 1.0, "grad_norm": 1.0, "step": s} for s in range(1, 11)]).save_to_json(
        str(out / "trainer_state.json"))
    (out / "training_args.bin").write_bytes(b"\x80\x02}q\x00.")  # an old, non-zip torch.save
    (run,), problems = read_paths([out / "trainer_state.json"])
    assert problems == [] and run.steps == 10 and run.segments == ()
    assert any("cannot be read safely" in note and "zip" in note for note in run.notes)


def test_a_running_token_total_is_differenced_per_step(tmp_path: Path) -> None:
    """TRL's ``num_tokens`` is a running total, logged here every second step; capacity is
    per-device 8 x GA 2 x data-parallel 2 (4 ranks over CP 2) x 512 tokens = 16,384."""
    args: dict[str, object] = {"per_device_train_batch_size": 8,
                               "gradient_accumulation_steps": 2, "world_size": 4,
                               "context_parallel_size": 2, "max_length": 512}
    for name, factor, expected in (("twice", 2.0, [("TokensOverCounted", 8, "train/num_tokens")]),
                                   ("once", 1.0, [])):
        directory = tmp_path / name / "run"
        directory.mkdir(parents=True)
        rows = {s: {**v, "num_tokens": factor * 12_000 * s}
                for s, v in sft_curves(range(2, 21, 2)).items()}
        write_segment(directory, args, rows)
        assert signatures(directory) == expected, name
    (run,), _ = read_paths([tmp_path / "twice"])
    finding = next(f for f in diagnose(run).findings if f.alert == "TokensOverCounted")
    assert "CP size 2" in finding.what_to_check and "16384" in finding.what_to_check


_WANDB_RESUMER = """
import json, sys, wandb
spec = json.load(open(sys.argv[1]))
# a Hugging Face run resumed with W&B's resume=: one process per segment, the same run id
for part in spec["parts"]:
    run = wandb.init(project="diagnose", mode="offline", id=spec["id"], resume="allow",
                     dir=spec["dir"], config=part["config"])
    for step, values in part["rows"]:
        run.log({**{f"train/{k}": v for k, v in values.items()}, "train/global_step": step})
    run.finish()
"""


def write_resumed_wandb(tmp: Path, loss_factor: float) -> Path:
    curves = sft_curves(range(1, 41))
    parts = [{"config": hf_args(ga), "rows": [
        [s, {**v, "loss": v["loss"] * (loss_factor if s > 20 else 1.0)}]
        for s, v in curves.items() if lo <= s <= hi]} for ga, lo, hi in ((1, 1, 20), (4, 21, 40))]
    tmp.mkdir(parents=True)
    spec = {"id": "resumed1", "dir": str(tmp), "parts": parts}
    (tmp / "spec.json").write_text(json.dumps(spec))
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(tmp)}
    subprocess.run([sys.executable, "-c", _WANDB_RESUMER, str(tmp / "spec.json")], env=env,
                   check=True, timeout=120)
    return tmp


def test_a_wandb_run_resumed_offline_is_joined_and_its_ga_change_seen(tmp_path: Path) -> None:
    faulty = write_resumed_wandb(tmp_path / "faulty", 0.25)
    runs, problems = read_paths([faulty])
    assert problems == [] and len(runs) == 1
    run = runs[0]
    assert run.steps == 40 and any("joined 2 offline-run directories" in n for n in run.notes)
    assert [(s.first_step, s.settings.gradient_accumulation_steps) for s in run.segments] \
        == [(1, 1), (21, 4)]
    assert signatures(faulty) == [("ScaledByGradAccumulation", 21, "train/loss")]
    healthy = write_resumed_wandb(tmp_path / "healthy", 1.0)
    assert signatures(healthy) == []
