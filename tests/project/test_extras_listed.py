"""Every test file marked for the extras venv is one `make test-extras` runs (else its tests
would only ever be skipped, in the main venv, and nothing would say so)."""

from __future__ import annotations

import re

from tests.support.paths import REPO

ROOT = REPO
EXTRAS_MARKERS = ("vllm", "deepspeed", "torch", "trl", "frameworks")


def test_every_extras_marked_file_is_in_the_test_extras_target() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    recipe = makefile.split("test-extras:", 1)[1].split("\n\n", 1)[0]
    listed = {p.name for pattern in re.findall(r"tests/\S+\.py", recipe)
              for p in ROOT.glob(pattern)}
    marked = re.compile(r"pytest\.mark\.(" + "|".join(EXTRAS_MARKERS) + r")\b")
    missing = sorted(p.name for p in (ROOT / "tests").glob("test_*.py")
                     if marked.search(p.read_text(encoding="utf-8")) and p.name not in listed)
    assert missing == []
