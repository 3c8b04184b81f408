"""A Reporter runs a sender thread: one a test leaves open is closed when the test ends, so the
unit layer's check that no thread outlives a test (tests/unit/conftest.py) holds for tests
that only look at a step or two."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rlmon.actors.reporter.sink import close_open_senders


@pytest.fixture(autouse=True)
def _close_open_reporters() -> Iterator[None]:
    yield
    close_open_senders(timeout=5.0)
