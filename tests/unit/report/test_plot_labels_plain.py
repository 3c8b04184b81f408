"""Plot labels are plain text (issue 40, E5): a metric or alert name with ``$...$`` is drawn as
written, never as matplotlib mathtext, and ``report --html`` / ``diagnose --html`` never fail
on one (``evil$\\undefinedmacro$`` with one NaN left no file at all)."""

from __future__ import annotations

import base64
import io
import json
import math
import re
from pathlib import Path

import pytest

from rlmon.cli import main
from rlmon.service.report.html import _curve_png
from rlmon.service.report.model import Curve

NAMES = ["evil$\\undefinedmacro$", "$\\frac{a}{b}$", "a$b", "$$", "$\\sqrt{\\x}{$", "^_$%{}\\"]


def _state_with(path: Path, name: str) -> Path:
    """A trainer_state.json whose key ``name`` has one NaN (a NonFiniteMetric curve)."""
    rows = [{"step": s, "loss": 1.0 / s, name: math.nan if s == 7 else 0.1 * s}
            for s in range(1, 21)]
    path.mkdir(parents=True)
    (path / "trainer_state.json").write_text(json.dumps({"global_step": 20,
                                                         "log_history": rows}))
    return path


@pytest.mark.parametrize("name", NAMES)
def test_report_and_diagnose_html_draw_any_name(tmp_path: Path, name: str) -> None:
    log = _state_with(tmp_path / "run", name)
    for command in ("report", "diagnose"):
        out = tmp_path / f"{command}.html"
        main([command, str(log), "--html", str(out)])
        page = out.read_text()
        assert page.count("data:image/png;base64,") >= 1, command


def _pixels(png: str) -> object:
    import matplotlib.image

    return matplotlib.image.imread(io.BytesIO(base64.b64decode(png)), format="png")


def test_a_name_is_drawn_literally_not_as_mathtext() -> None:
    """The fraction's label is drawn as its characters: the same picture as matplotlib draws
    for that text with math parsing off, and not the one it draws with it on."""
    import matplotlib
    import numpy as np

    points = tuple((s, float(s)) for s in range(10))
    curve = Curve("actor", "$\\frac{a}{b}$", points, ((3, "NonFiniteMetric", "firing"),))
    drawn = _pixels(_curve_png(curve))
    with matplotlib.rc_context({"text.parse_math": True}):
        from rlmon.service.report import html

        as_math = _pixels(html._curve_png.__wrapped__(curve))  # type: ignore[attr-defined]
    assert not np.array_equal(drawn, as_math)
    assert re.fullmatch(r"[A-Za-z0-9+/=]+", _curve_png(Curve("a", "evil$\\undefinedmacro$",
                                                             points, ())))
