"""The run page's API tests read a service fed the bundled example run (``service``, from
tests/conftest.py)."""

from __future__ import annotations

import pytest

from rlmon.service.contract.step_record import StepRecord
from tests.support.web_support import example_records


@pytest.fixture(scope="module")
def records() -> list[StepRecord]:
    return example_records()
