"""The run page in a headless Chromium: one browser per module, a fresh tab per test on the
test's ``service`` (tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rlmon.service.service_core import ServiceCore
from tests.support.web_support import browser, need_chromium


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    with browser(need_chromium()) as b:
        yield b


@pytest.fixture
def page(chromium: Any, service: ServiceCore, tmp_path: Path) -> Iterator[Any]:
    """A tab whose ``base`` is the service's run page (polling every 250 ms); the test fails if
    the page raised."""
    context = chromium.new_context(viewport={"width": 1400, "height": 1000})
    tab = context.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    console: list[str] = []
    tab.on("console", lambda msg: console.append(f"{msg.type}: {msg.text}"))
    tab.base = f"http://127.0.0.1:{service.port}/?poll=250"
    yield tab
    # what the page showed at the end (a failure's evidence), in the test's tmp dir
    (tmp_path / "page.html").write_text(tab.content())
    (tmp_path / "console.log").write_text("\n".join(console))
    context.close()
    assert not errors, f"the page raised: {errors}"
