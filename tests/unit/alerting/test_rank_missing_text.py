"""RankMissing names the missing ranks, how many of how many, since which step, and says what to
check and what to change."""

from __future__ import annotations

from rlmon.service.alerting.engine import AlertEngine
from rlmon.service.alerting.rules import default_rules
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.metrics.rank import Rank


def _record(step: int, missing: tuple[Rank, ...]) -> StepRecord:
    return StepRecord("r", "actor", step, not missing, 4, 4 - len(missing), missing,
                      {"actor/loss": 1.0})


def test_rank_missing_names_the_rank_the_count_and_the_step_and_what_to_do() -> None:
    engine = AlertEngine([r for r in default_rules() if r.name == "RankMissing"])
    assert engine.evaluate(_record(11, ())) == []
    (event,) = engine.evaluate(_record(12, (Rank(dp=3),)))
    assert event.alert == "RankMissing" and event.state == "firing"
    assert event.detail.startswith("Missing dp=3 (1 of 4 ranks) from step 12 on.")
    assert "To change: restart the lost ranks" in event.detail
    assert event.what_to_check.startswith("the missing ranks' processes")
    many = tuple(Rank(dp=d, cp=c) for d in range(5) for c in range(2))
    record = StepRecord("r2", "actor", 3, False, 16, 6, many, {})
    (event,) = engine.evaluate(record)
    assert "dp=1 cp=1" in event.detail and "and 2 more (10 of 16 ranks) from step 3" \
        in event.detail
