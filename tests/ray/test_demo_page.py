"""``rlmon demo`` in a terminal: it prints the run page's address, keeps the service up until
Ctrl-C, and the page shows the demo's run in Debian's headless Chromium (the README's screenshot,
docs/run-page.png, is this page: written with RLMON_UPDATE_SCREENSHOT=1). Each alert is printed
once (the console notifier's line), and no route names a destination nobody configured."""

from __future__ import annotations

import os
import pty
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.support.polling import CHILD_RUN_S, PATIENCE_S, wait_for
from tests.support.web_support import browser, need_chromium

pytestmark = [pytest.mark.ray, pytest.mark.slow]

DOCS_SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "run-page.png"


def _collect(stream: object, into: list[str]) -> None:
    for line in iter(stream.readline, ""):  # type: ignore[attr-defined]
        into.append(line)


def test_demo_in_a_terminal_serves_its_run_page_until_ctrl_c(tmp_path: Path) -> None:
    chromium = need_chromium()
    env = {**os.environ, "RAY_DISABLE_USAGE_STATS": "1", "RAY_AUTH_MODE": "disabled"}
    terminal, side = pty.openpty()  # stdin is a terminal, as for a user
    # and Ctrl-C works, as in a user's foreground job: a suite started in the background (`&`,
    # nohup) ignores SIGINT, which exec passes on, and Python then never raises KeyboardInterrupt
    ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # the child's becomes SIG_DFL
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rlmon.cli", "demo", "--steps", "16", "--port", "0",
             "--plot", str(tmp_path / "demo.png")],
            stdin=side, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
            cwd=tmp_path)
    finally:
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
    out: list[str] = []
    err: list[str] = []
    for stream, into in ((proc.stdout, out), (proc.stderr, err)):
        threading.Thread(target=_collect, args=(stream, into), daemon=True).start()
    try:
        waiting = wait_for(lambda: next((m for line in out if (m := re.search(
            r"the run page stays up at (http://\S+?);", line))), None) or proc.poll() is not None,
            timeout=CHILD_RUN_S, what="the demo to wait for Ctrl-C")
        assert proc.poll() is None, "".join(err)[-3000:]
        url = waiting.group(1)
        assert f"the run page at {url}" in "".join(out)
        with browser(chromium) as b:
            tab = b.new_page(viewport={"width": 1400, "height": 1000})
            raised: list[str] = []
            tab.on("pageerror", lambda exc: raised.append(str(exc)))
            tab.goto(url)
            try:
                tab.wait_for_selector("#panels .panel[data-onsets]", timeout=PATIENCE_S * 1000)
            finally:
                assert not raised, raised
            onsets = tab.eval_on_selector_all("#panels .panel", "p => p.map(e => e.dataset.onsets)")
            points = tab.eval_on_selector_all("#panels .panel", "p => p.map(e => e.dataset.points)")
            assert set(points) == {"16"}
            assert any(onsets), onsets  # the stale weights' alerts are marked
            png = tab.screenshot(full_page=True)
            # the runs table lists the demo's run once, its roles beneath it
            tab.goto(url.split("#")[0] + "#/")
            tab.wait_for_selector("#runs tr.run-row")
            runs = tab.eval_on_selector_all("#runs tr.run-row", "r => r.map(e => e.dataset.run)")
            roles = tab.eval_on_selector_all("#runs tr.role-row", "r => r.map(e => e.dataset.run)")
            assert len(runs) == 1 and len(roles) == 3 and set(roles) == set(runs), (runs, roles)
        (tmp_path / "run-page.png").write_bytes(png)
        if os.environ.get("RLMON_UPDATE_SCREENSHOT") == "1":
            DOCS_SCREENSHOT.write_bytes(png)
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0, "".join(err)[-3000:]
        assert time.monotonic() - started < 60
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(terminal)
        os.close(side)
    wait_for(lambda: any("alerts fired" in line for line in out), PATIENCE_S, "the summary")
    text, errors = "".join(out), "".join(err)
    # run as a first-time user runs it, the state in a fresh temporary directory it names and
    # keeps for `rlmon report`; removed here, so the suite leaves nothing behind
    kept = re.search(r"\(rlmon report \S+ --state-dir (\S+)\)", text)
    assert kept is not None and Path(kept.group(1)).name.startswith("rlmon-demo-"), text[-2000:]
    assert (Path(kept.group(1)) / "history.sqlite").is_file()
    shutil.rmtree(kept.group(1))
    firings = re.findall(r"\[(?:WARNING|CRITICAL)\] (\w+) on (\S+) step (\d+)", text + errors)
    assert firings and len(firings) == len(set(firings)), firings  # each alert once
    assert "ALERT FIRING" not in text + errors
    assert "not configured" not in errors
