"""``rlmon diagnose`` refuses special files unopened, in a child process with its memory bounded (a
hang or an unbounded read would otherwise take the test process with it)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO


def _limit_memory() -> None:  # a reader without bounds hits MemoryError fast, not the machine
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_special_files_are_refused_unopened(tmp_path: Path) -> None:
    fifo_dir, zero_dir = tmp_path / "fifo", tmp_path / "zero"
    fifo_dir.mkdir()
    zero_dir.mkdir()
    os.mkfifo(fifo_dir / "trainer_state.json")  # was a hang
    (zero_dir / "trainer_state.json").symlink_to("/dev/zero")  # was a MemoryError traceback
    out = subprocess.run(
        [sys.executable, "-m", "rlmon", "diagnose", str(fifo_dir), str(zero_dir / "trainer_state.json"),
         "/dev/null"],
        capture_output=True, text=True, timeout=60, cwd=REPO, preexec_fn=_limit_memory,
        check=False)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    assert f"{fifo_dir / 'trainer_state.json'}: a FIFO, not a regular file: refused" in out.stderr
    assert f"{zero_dir / 'trainer_state.json'}: a device, not a regular file: refused" \
        in out.stderr
    assert "/dev/null: a device, not a regular file: refused" in out.stderr
