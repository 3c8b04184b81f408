"""``rlmon replay`` on hostile or careless input (issue 32): its input is printed as text, never
as Rich markup; a line of tens of MiB is rejected without ever being held whole (peak memory
measured with tracemalloc); a FIFO or a device is refused unopened with exit 2, never a hang or
a traceback."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest

from rlmon.cli import main
from rlmon.service.contract.records import MAX_LINE_BYTES
from tests.support.paths import REPO

EXAMPLE = REPO / "rlmon" / "data" / "example_run.jsonl"


def _line(run: str = "r1", role: str = "actor", step: int = 0) -> str:
    return json.dumps({"run": run, "role": role, "step": step,
                       "metrics": {"actor/entropy": {"sum": 1.0, "count": 1}}})


def test_input_is_printed_as_text_never_as_markup(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "hostile.jsonl"
    path.write_text("\n".join([
        _line(run="[/oops]"),  # was a MarkupError traceback and no table
        _line(run="[link=https://evil.example]click[/link]"),  # was a terminal hyperlink
        _line(role="Bad-Role"),
        _line(step=1),
    ]) + "\n")
    assert main(["replay", str(path)]) == 2
    out, err = capsys.readouterr()
    assert '"[/oops]"' in err
    assert "[link=https://evil.example]click[/link]" in err
    # the role error shows the real pattern (the markup parser ate "[a-z]" and "[a-z0-9_]")
    assert "must match [a-z][a-z0-9_]* (at most 64)" in err
    assert "rlmon replay" in out and "Traceback" not in err


def test_a_huge_line_is_rejected_without_being_held(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    size = 10 * MAX_LINE_BYTES  # 40 MiB on one line, between two good ones
    path = tmp_path / "huge.jsonl"
    with path.open("wb") as handle:
        handle.write(_line(step=0).encode() + b"\n")
        block = b"x" * (1 << 20)
        for _ in range(size // len(block)):
            handle.write(block)
        handle.write(b"\n" + _line(step=1).encode() + b"\n")
    tracemalloc.start()
    try:
        code = main(["replay", str(path), "--json"])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert code == 2
    out, err = capsys.readouterr()
    errors = [json.loads(line) for line in err.splitlines() if '"error"' in line]
    assert errors == [{"type": "error", "line": 2,
                       "error": f"line of {size} bytes exceeds {MAX_LINE_BYTES} (skipped unread)"}]
    steps = [json.loads(line) for line in out.splitlines() if '"step"' in line]
    assert [s["step"] for s in steps if s.get("type") == "step"] == [0, 1]
    # a line is read in 64 KiB chunks: the peak is far below the line (it was 3.25x a 1 GB line)
    assert peak < 2 * MAX_LINE_BYTES, f"peak {peak / 2**20:.1f} MiB for a {size >> 20} MiB line"
