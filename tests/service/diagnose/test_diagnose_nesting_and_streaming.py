"""Every reader of ``rlmon diagnose`` bounds the nesting of the JSON it reads (issue 40, E4: a
``RecursionError`` traceback was the answer to a deep TensorBoard text summary, config string,
W&B history line or rlmon file), and a W&B run file is streamed a block at a time (E9: a sparse
3.9 GB file, 12 KB on disk, cost 3.9 GB)."""

from __future__ import annotations

import json
import resource
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from rlmon.cli import main
from rlmon.service.json_input import MAX_DEPTH, TooDeep, loads
from rlmon.service.json_output import dumps
from tests.support.diagnose_support import trl_curves

DEPTHS = [MAX_DEPTH + 1, 900, 5_000, 200_000]


def _deep_list(depth: int) -> str:
    return "[" * depth + "]" * depth


def _deep_object(depth: int) -> str:
    return '{"a": ' * depth + "1" + "}" * depth


def _diagnose(paths: list[Path]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rlmon", "diagnose", *map(str, paths)],
                          capture_output=True, text=True, timeout=120)


def _tensorboard(directory: Path, text: str) -> Path:
    """A Trainer's event file: ``text`` as its arguments' text summary, then scalars."""
    from tensorboard.compat.proto import event_pb2
    from tensorboard.plugins.scalar.summary_v2 import scalar_pb
    from tensorboard.plugins.text.summary_v2 import text_pb
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    directory.mkdir(parents=True)
    writer = EventFileWriter(str(directory))
    writer.add_event(event_pb2.Event(wall_time=1.0, step=1, summary=text_pb("args", text)))
    for step, values in trl_curves().items():
        for key, value in values.items():
            writer.add_event(event_pb2.Event(wall_time=1.0 + step, step=step,
                                             summary=scalar_pb(f"train/{key}", value)))
    writer.close()
    return directory


def _history_jsonl(path: Path, deep_line: str) -> Path:
    lines = [json.dumps({"_step": s, **{f"train/{k}": v for k, v in values.items()}})
             for s, values in trl_curves().items()]
    lines.insert(3, deep_line)
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("depth", DEPTHS)
@pytest.mark.parametrize("shape", ["list", "object"])
def test_every_reader_refuses_deep_json_by_name(tmp_path: Path, depth: int, shape: str) -> None:
    deep = _deep_list(depth) if shape == "list" else _deep_object(depth)
    paths = [
        _tensorboard(tmp_path / "tb-text", '{"output_dir": "o", "x": ' + deep + "}"),
        # a config string inside the arguments (as the HF arguments keep DeepSpeed's)
        _tensorboard(tmp_path / "tb-config-string", json.dumps(
            {"gradient_accumulation_steps": 2, "deepspeed": '{"zero": ' + deep + "}"})),
        _history_jsonl(tmp_path / "history.jsonl",
                       '{"_step": 4, "train/loss": 1.0, "x": ' + deep + "}"),
        _history_jsonl(tmp_path / "history-first.jsonl", '{"_step": 0, "x": ' + deep + "}"),
    ]
    rlmon_file = tmp_path / "partials.jsonl"  # rlmon's own partial reports, one line deep
    good = {"run": "r", "role": "actor", "step": 0, "metrics": {"actor/loss": {"sum": 1.0, "count": 1}}}
    rlmon_file.write_text(json.dumps(good) + "\n" + '{"run": "r", "role": "actor", "step": 1, '
                          '"metrics": {"actor/loss": ' + deep + "}}\n")
    out = _diagnose([*paths, rlmon_file])
    assert "Traceback" not in out.stderr and "RecursionError" not in out.stderr, out.stderr[-3000:]
    assert out.returncode in (0, 2), out.stderr[-3000:]
    # each run still diagnosed: the deep value is named and the rest read
    assert out.stdout.count("framework:") == len(paths) + 1, (out.stdout, out.stderr)
    # the W&B lines name their line and the depth
    assert f"history.jsonl:4: JSON nested deeper than {MAX_DEPTH} levels" in out.stderr
    assert "history-first.jsonl:4: JSON nested deeper" in out.stderr


def test_loads_bounds_depth_without_recursion() -> None:
    assert loads(_deep_list(MAX_DEPTH)) is not None
    for depth in DEPTHS:
        with pytest.raises(TooDeep, match=f"deeper than {MAX_DEPTH} levels"):
            loads(_deep_object(depth))
    assert loads(b'{"a": [1, NaN]}')["a"][0] == 1


def test_json_output_writes_non_finite_as_null_with_the_reason() -> None:
    inf, nan = float("inf"), float("nan")
    assert json.loads(dumps({"a": inf, "b": [nan, 1.0], "c": {"d": -inf}, "e": (1, inf)})) == {
        "a": None, "a_not_finite": "inf", "b": [None, 1.0],
        "c": {"d": None, "d_not_finite": "-inf"}, "e": [1, None]}


# -- W&B run files: LevelDB log framing around W&B's protobuf records, written here as the SDK
# writes them (the SDK's own writer is exercised in test_diagnose_wandb.py)

_BLOCK = 32768


def _frame(records: list[bytes]) -> bytes:
    out = bytearray(struct.pack("<4sHB", b":W&B", 0xBEE1, 0))
    for data in records:
        first = True
        while True:
            room = _BLOCK - len(out) % _BLOCK
            if room < 7:
                out += bytes(room)
                continue
            piece, data = data[:room - 7], data[room - 7:]
            last = not data
            kind = 1 if first and last else 2 if first else 4 if last else 3
            out += struct.pack("<IHB", zlib.crc32(piece, zlib.crc32(bytes([kind]))),
                               len(piece), kind) + piece
            first = False
            if last:
                break
    return bytes(out)


def _history(step: int, values: dict[str, str]) -> bytes:
    from wandb.proto import wandb_internal_pb2

    record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]
    for key, value_json in {**values, "train/global_step": str(step)}.items():
        item = record.history.item.add()
        item.key, item.value_json = key, value_json
    record.history.step.num = step
    return bytes(record.SerializeToString())


def _run_file(directory: Path, deep_at: int | None = None, padding: str = "") -> Path:
    rows = [_history(s, {f"train/{k}": json.dumps(v) for k, v in values.items()})
            for s, values in trl_curves().items()]
    if deep_at is not None:
        rows.insert(deep_at, _history(1000, {"train/loss": _deep_list(5_000)}))
    directory.mkdir(parents=True)
    path = directory / "run-abc.wandb"
    path.write_bytes(_frame(rows) + padding.encode())
    return path


def test_a_deep_value_in_a_wandb_run_file_is_named_and_the_rest_read(tmp_path: Path) -> None:
    path = _run_file(tmp_path / "offline-run-1", deep_at=5)
    out = _diagnose([path.parent])
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    assert "JSON nested deeper than" in out.stderr and out.returncode == 2
    assert ", 40 steps; framework:" in out.stdout


def _limit_memory() -> None:  # a file read whole is a MemoryError here, not 4 GB of the machine
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


@pytest.mark.parametrize("hole_at", ["end", "middle"])
def test_a_sparse_wandb_run_file_is_streamed(tmp_path: Path, hole_at: str) -> None:
    """3.9 GB apparent, a few KB on disk: the run file is read a block at a time and stops at
    the zero padding (a hole reads as zeros), in a child that may map no more than 2 GiB."""
    path = _run_file(tmp_path / "offline-run-1")
    size = 3_900_000_000
    with path.open("r+b") as handle:
        if hole_at == "middle":  # more records after the hole: zeros end the log, as padding
            tail = _frame([_history(99, {"train/loss": "1.0"})])
            handle.seek(size - len(tail))
            handle.write(tail)
        handle.truncate(size)
    assert path.stat().st_size == size and path.stat().st_blocks * 512 < 1 << 20
    out = subprocess.run([sys.executable, "-m", "rlmon", "diagnose", str(path.parent),
                          "--json"], capture_output=True, text=True, timeout=120,
                         preexec_fn=_limit_memory)
    assert "Traceback" not in out.stderr and "MemoryError" not in out.stderr, out.stderr[-2000:]
    assert json.loads(out.stdout.splitlines()[0])["steps"] == 40


def test_a_damaged_run_file_still_says_where(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = _run_file(tmp_path / "offline-run-1")
    data = bytearray(path.read_bytes())
    data[len(data) * 3 // 4] ^= 0xFF  # inside a record past the first ones
    path.write_bytes(bytes(data))
    assert main(["diagnose", str(path.parent)]) == 2
    captured = capsys.readouterr()
    assert "corrupt record at byte" in captured.err
    assert "framework:" in captured.out  # the records before the damage diagnosed
