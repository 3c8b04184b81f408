"""Reading a 50,000-entry trainer state keeps the reader's memory under the file's size (memory
measured with tracemalloc over a generated 9 MiB file: seconds of CPU, in the service layer with
the soaks)."""

from __future__ import annotations

import json
import sys
import tracemalloc
from pathlib import Path

from rlmon.service.diagnose.formats import read_paths
from tests.support.paths import REPO


def test_a_long_state_is_read_in_memory_that_follows_the_values(tmp_path: Path) -> None:
    """50,000 entries (9 MiB of text): read a value at a time into columns (8 bytes a value and
    a byte saying it was logged), the reader's peak stays under the file's size (it held the
    text, every entry's dict and the rows: several times the file)."""
    sys.path.insert(0, str(REPO / "bench"))
    try:
        from bench_diagnose import build
    finally:
        sys.path.remove(str(REPO / "bench"))
    path = tmp_path / "trainer_state.json"
    build(path, 50_000)
    tracemalloc.start()
    try:
        (run,), problems = read_paths([path])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert problems == [] and run.steps == 50_000
    assert run.rows[49_999]["loss"] == json.loads(path.read_text())["log_history"][-2]["loss"]
    assert peak < path.stat().st_size, f"peak {peak / 2**20:.1f} MiB"
