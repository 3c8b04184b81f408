"""The unit layer (docs/development.md, "The suite in layers"): each test runs without
subprocesses or sockets, and fails if it leaves a thread alive; tests/conftest.py gives it the
layer's 10 s limit."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import pytest

from tests.support.unit_layer import refuse_processes_and_sockets, threads_left


@pytest.fixture(scope="session", autouse=True)
def _fonts_listed_once() -> None:
    """matplotlib lists the system's fonts (a ``fc-list`` child) the first time it is imported
    on a machine with fontconfig, then reads its cache: done here, before the layer's rules,
    so the first unit test that draws does not depend on another suite having drawn first."""
    with contextlib.suppress(ImportError):  # the report extra is not installed
        import matplotlib.font_manager  # noqa: F401


@pytest.fixture(autouse=True)
def _unit_layer_rules(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    before = set(threading.enumerate())
    refuse_processes_and_sockets(monkeypatch)
    yield
    left = threads_left(before)
    if left:
        pytest.fail(f"the test left threads alive: {', '.join(left)} (the unit layer starts "
                    "none that outlive it; close what started them, or move the test to "
                    "tests/service)")
