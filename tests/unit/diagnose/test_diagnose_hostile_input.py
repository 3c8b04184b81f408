"""``rlmon diagnose`` on hostile or careless files (issue 32): every reader is bounded before it
reads (a zip bomb is not inflated, a record length is checked against the file), special files
are refused unopened, bad steps are refused by name and the rest diagnosed; each failure is a
clear error naming the file and exit 2, never a traceback or a hang."""

from __future__ import annotations

import json
import struct
import tracemalloc
import zipfile
from pathlib import Path

import pytest

from rlmon.cli import main
from rlmon.service.diagnose.formats import read_paths
from tests.support.diagnose_support import trl_curves
from tests.unit.diagnose.test_diagnose_trainer_state import write_state


def test_a_zip_bomb_training_args_is_not_inflated(tmp_path: Path) -> None:
    write_state(tmp_path / "out" / "trainer_state.json", trl_curves())
    bomb = tmp_path / "out" / "training_args.bin"
    inflated = 256 << 20
    with zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as archive, \
            archive.open("archive/data.pkl", "w", force_zip64=True) as member:
        block = bytes(1 << 20)
        for _ in range(inflated // len(block)):
            member.write(block)
    assert bomb.stat().st_size < 2 << 20  # a 2 MB file that inflates to 256 MiB
    tracemalloc.start()
    try:
        (run,), problems = read_paths([tmp_path / "out"])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert problems == [] and run.steps == 40  # the values are still diagnosed
    assert any(f"inflates to {inflated} bytes" in note and "refused" in note
               for note in run.notes), run.notes
    assert peak < 32 << 20, f"peak {peak / 2**20:.0f} MiB"


def _masked_crc(data: bytes) -> int:
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    return int(masked_crc32c(data))


def test_a_record_longer_than_the_file_is_damage_not_an_allocation(tmp_path: Path) -> None:
    """28 bytes claiming a 2^62-byte record, with a valid header checksum."""
    directory = tmp_path / "run"
    directory.mkdir()
    path = directory / "events.out.tfevents.1.host"
    length = struct.pack("<Q", 1 << 62)
    path.write_bytes(length + struct.pack("<I", _masked_crc(length)) + bytes(16))
    runs, (problem,) = read_paths([path])
    assert runs == []
    assert problem.path == str(path)
    assert f"claims {1 << 62} bytes, more than the 12 left in the file" in problem.message


def test_bad_steps_are_refused_by_name_and_the_rest_diagnosed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_state(tmp_path / "out" / "trainer_state.json", trl_curves())
    state = json.loads(path.read_text())
    state["log_history"][3:3] = [{"loss": 1.0, "step": -4}, {"loss": 1.0, "step": 10**29}]
    path.write_text(json.dumps(state))
    page = tmp_path / "report.html"
    assert main(["diagnose", str(path), "--html", str(page), "--json"]) == 2  # was OverflowError
    out, err = capsys.readouterr()
    errors = [json.loads(line) for line in err.splitlines() if '"error"' in line]
    assert [(e["file"], e["error"]) for e in errors] == [
        (f"{path}: log_history[3]", "'step' must be between 0 and 9007199254740991, got -4"),
        (f"{path}: log_history[4]", "'step' must be between 0 and 9007199254740991, got "
         + str(10**29)),
    ]
    source = json.loads(out.splitlines()[0])
    assert source["steps"] == 40
    assert page.stat().st_size > 0
