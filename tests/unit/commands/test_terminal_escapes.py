"""Terminal output never carries a control character from the input (issue 40, E7): foreign
key names and file names with escape sequences (a hyperlink to another site, a cleared screen,
hidden text, a carriage return, a bidirectional override) are shown as their escapes by
``diagnose``, ``report`` and ``diff``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rlmon.cli import main
from rlmon.service.terminal_text import visible

HOSTILE = ["\x1b]8;;https://evil.example\x07click here\x1b]8;;\x07", "\x1b[2J\x1b[H",
           "\x1b[8mhidden\x1b[0m", "ok\rEVIL", "\u202egnp.exe", "\x9b31m", "a\x00b\x7f"]
_ANY_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _history(path: Path, factor: float, key: str) -> Path:
    rows = [{"_step": s, "train/loss": factor / s, "train/reward": 0.01 * s * factor,
             "train/entropy": 1.0, key: float("nan") if s == 5 else s * factor}
            for s in range(1, 41)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("hostile", HOSTILE)
def test_diagnose_report_and_diff_show_escapes_visibly(
        tmp_path: Path, hostile: str, capsys: pytest.CaptureFixture[str]) -> None:
    in_name = hostile.replace("/", "_").replace("\x00", "_")  # as a file name allows
    a = _history(tmp_path / f"a{in_name}.jsonl", 1.0, f"train/{hostile}")
    b = _history(tmp_path / f"b{in_name}.jsonl", 3.0, f"train/{hostile}")
    for args in (["diagnose", str(a)], ["report", str(a)], ["diff", str(a), str(b)],
                 ["diagnose", str(a), str(tmp_path / f"missing{in_name}")]):
        main(args)
        captured = capsys.readouterr()
        text = captured.out + captured.err
        assert not _ANY_CONTROL.search(text), (args[0], repr(text[:400]))
        assert visible(in_name) in text, (args[0], visible(in_name))
    main(["diagnose", str(a)])  # the key name itself, among the keys listed
    assert visible(f"train/{hostile}") in capsys.readouterr().out


def test_visible_escapes_every_control_and_keeps_lines() -> None:
    assert visible("a\x1b[2Jb\n\tc\r") == "a\\x1b[2Jb\n\tc\\x0d"
    assert visible("\u202eabc\u200b") == "\\u202eabc\\u200b"
    assert visible("caf\u00e9 \u4e2d") == "caf\u00e9 \u4e2d"  # printable text as it is
    assert not any(_ANY_CONTROL.search(visible(chr(c))) for c in range(0x110000))
