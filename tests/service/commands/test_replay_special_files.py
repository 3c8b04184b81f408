"""``rlmon replay`` refuses special files unopened, in a child process with its memory bounded (a
hang or an unbounded read would otherwise take the test process with it)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO


def _limit_memory() -> None:  # on a reader without bounds, /dev/zero ends in MemoryError, fast
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_special_files_are_refused_unopened(tmp_path: Path) -> None:
    fifo = tmp_path / "run.jsonl"
    os.mkfifo(fifo)
    zero = tmp_path / "zero.jsonl"
    zero.symlink_to("/dev/zero")
    for path, kind in ((fifo, "a FIFO"), (zero, "a device"), (Path("/dev/null"), "a device")):
        out = subprocess.run([sys.executable, "-m", "rlmon", "replay", str(path)],
                             capture_output=True, text=True, timeout=60, cwd=REPO,
                             preexec_fn=_limit_memory, check=False)
        assert out.returncode == 2, out.stderr
        assert f"{path}: {kind}, not a regular file: refused" in out.stderr
        assert "Traceback" not in out.stderr
