"""record_many: the same step as record() call by call, checked names, refusals counted."""

from __future__ import annotations

import pytest

from rlmon.actors.reporter import Reporter
from rlmon.actors.reporter.sink import LocalSink
from rlmon.service.metrics import catalog


def _reporter(sink: LocalSink) -> Reporter:
    return Reporter("m", "actor", rank={"dp": 0}, world={"dp": 1}, sink=sink, step_seconds=False,
                    hardware_interval=None)  # the step holds what the test recorded, nothing else


def test_record_many_equals_record_call_by_call() -> None:
    one, many = LocalSink(), LocalSink()
    by_call, batched = _reporter(one), _reporter(many)
    for step in range(2):
        for mb in range(3):
            by_call.record(catalog.LOSS, sum=1.5 * mb + step, count=4 + mb)
            by_call.record(catalog.IS_RATIO_MAX, max=1.0 + mb)
            by_call.record(catalog.LR, value=1e-6)
            by_call.record("user/spread", count=2, sum=float(mb), sqsum=3.0)
            batched.record_many({
                catalog.LOSS: (1.5 * mb + step, 4 + mb),
                catalog.IS_RATIO_MAX: {"max": 1.0 + mb},
                catalog.LR: 1e-6,
                "user/spread": {"count": 2, "sum": float(mb), "sqsum": 3.0},
            })
        by_call.end_step(step)
        batched.end_step(step)
    assert by_call.flush(5) and batched.flush(5)
    assert [r.metrics for r in one.records] == [r.metrics for r in many.records]
    assert batched.rejected == 0


def test_a_bare_number_takes_the_catalog_form() -> None:
    sink = LocalSink()
    rep = _reporter(sink)
    rep.record_many({catalog.IS_RATIO_MAX: 3.0, catalog.LOSS: 0.5, "user/free": 7.0})
    rep.record_many({catalog.IS_RATIO_MAX: 2.0, catalog.LOSS: 1.5})
    rep.end_step(0)
    assert rep.flush(5)
    metrics = sink.records[0].metrics
    assert metrics[catalog.IS_RATIO_MAX] == 3.0  # max form: the larger of the two
    assert metrics[catalog.LOSS] == 1.0  # mean form: one observation each
    assert metrics["user/free"] == 7.0  # not in the catalog: a value


def test_the_mapping_is_copied_at_the_call() -> None:
    sink = LocalSink()
    rep = _reporter(sink)
    reused = {catalog.LOSS: (2.0, 1.0)}
    rep.record_many(reused)
    reused[catalog.LOSS] = (100.0, 1.0)
    rep.end_step(0)
    assert rep.flush(5)
    assert sink.records[0].metrics[catalog.LOSS] == 2.0


def test_a_bad_name_raises_on_the_training_thread() -> None:
    rep = _reporter(LocalSink())
    with pytest.raises(ValueError, match="bad metric name"):
        rep.record_many({catalog.LOSS: (1.0, 1.0), "": 1.0})
    rep.close()


@pytest.mark.parametrize(("stat", "why"), [
    ((1.0, -1.0), "count"),
    ({"sum": 1.0, "max": 2.0}, "statistic form"),
    ((1.0, 2.0, 3.0), "pair"),
    ({"max": 1.0}, "recorded as"),  # user/bad is a mean this step (record() below)
])
def test_a_malformed_statistic_is_refused_and_counted_the_rest_sent(
    stat: object, why: str,
) -> None:
    sink = LocalSink()
    rep = _reporter(sink)
    rep.record("user/bad", sum=1.0, count=1.0)
    rep.record_many({"user/bad": stat, catalog.LOSS: (3.0, 2.0)})
    rep.end_step(0)
    assert rep.flush(5)
    assert rep.rejected == 1
    assert rep.last_error is not None and "user/bad" in rep.last_error and why in rep.last_error
    assert sink.records[0].metrics[catalog.LOSS] == 1.5
    assert sink.records[0].metrics["user/bad"] == 1.0
