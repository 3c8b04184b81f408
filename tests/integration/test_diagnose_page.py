"""The HTML report of ``rlmon diagnose`` in a real headless browser (Debian's chromium)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.diagnose_support import trl_curves
from tests.support.web_support import browser, need_chromium
from tests.unit.diagnose.test_diagnose_cli import rlmon
from tests.unit.diagnose.test_diagnose_trainer_state import write_state

pytestmark = pytest.mark.integration


def test_html_report_renders_the_findings(tmp_path: Path) -> None:
    state = write_state(tmp_path / "trainer_state.json",
                        trl_curves(fault="entropy_collapse", at=25))
    page = tmp_path / "report.html"
    out = rlmon(str(state), "--html", str(page))
    assert out.returncode == 0, out.stderr
    with browser(need_chromium()) as chromium:
        tab = chromium.new_page()
        tab.goto(page.as_uri())
        text = tab.inner_text("body")
        assert "EntropyCollapse" in text and "critical firing" in text
        assert tab.title() == "rlmon diagnose"
        # the run report of `rlmon report` (issue 24), built from the diagnosed steps
        assert "Alerts and what they cost" in text
        rows = tab.locator("tr", has_text="EntropyCollapse")
        # the finding, the report's alert row, and the early warning handed over to it
        assert rows.count() == 3, rows.all_inner_texts()
        table = [rows.nth(i).locator("td").all_inner_texts() for i in range(1, 3)]
        cells = next(r for r in table if r[0] == "EntropyCollapse")
        sliding = next(r for r in table if r[0] == "EntropySliding")
        assert sliding[6] == "handed over to EntropyCollapse at step 27", sliding
        assert cells[:4] == ["EntropyCollapse", "critical", "trainer", "actor/entropy"]
        assert cells[5:7] == ["27", "firing"]
        assert tab.locator("img").count() >= 3  # key curves with the alert marked
        row = tab.locator("tr", has_text="EntropyCollapse").first.inner_text()
        assert row.startswith("27 (since 25)")
        assert "entropy: 22: " in row  # the context around the onset
        assert "The policy became deterministic" in row  # what to check
