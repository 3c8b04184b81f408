"""Finalized steps for tests: a StepRecord with every field named, the rest at plain defaults."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlmon.service.contract.step_record import StepRecord
from rlmon.service.metrics.rank import Rank

__all__ = ["step_record"]


def step_record(*, run: str = "r", role: str = "actor", step: int = 0,
                metrics: Mapping[str, float] | None = None, complete: bool = True,
                ranks_expected: int = 1, ranks_reporting: int | None = None,
                missing_ranks: tuple[Rank, ...] = (), **fields: Any) -> StepRecord:
    """A step of ``run``/``role``: complete, one rank expected and reporting, no metrics, unless
    said. ``ranks_reporting`` defaults to every expected rank; any other StepRecord field
    (``finalized_at``, ``timelines``, ``samples``, ...) is passed by name."""
    return StepRecord(
        run=run, role=role, step=step, complete=complete, ranks_expected=ranks_expected,
        ranks_reporting=ranks_expected if ranks_reporting is None else ranks_reporting,
        missing_ranks=missing_ranks, metrics=metrics if metrics is not None else {}, **fields)
