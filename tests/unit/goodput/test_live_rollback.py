"""A rollback live: a later attempt of the run re-runs steps the ledger already counted. Their
productive and overhead GPU-seconds cannot leave the counters, so they are added to the
rolled-back counter, and the counters corrected by it equal the offline report's buckets."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlmon.service.config import Settings
from rlmon.service.export.series import GOODPUT_ROLLED_BACK, GOODPUT_SECONDS
from rlmon.service.goodput.accounting import account_step
from rlmon.service.goodput.buckets import Bucket, SpanMap
from rlmon.service.report.model import build_report
from rlmon.service.service_core import ServiceCore
from tests.support.goodput_scenario import step_input
from tests.support.polling import wait_for
from tests.support.report_scenario import GOODPUT, RUN, step_records
from tests.support.scrape import Samples, scrape


def _service(state: Path, hold_steps: int) -> ServiceCore:
    return ServiceCore(Settings.model_validate({
        "notifiers": {"console": {"enabled": False}},
        "goodput": {**GOODPUT.model_dump(), "hold_steps": hold_steps}}), state_dir=state)


def _by_bucket(series: Samples, name: str) -> dict[Bucket, float]:
    out: dict[Bucket, float] = {}
    for (found, labels), value in series.items():
        if found == name:
            bucket = Bucket(dict(labels)["bucket"])
            out[bucket] = out.get(bucket, 0.0) + value
    return out


def _run(state: Path, hold_steps: int) -> tuple[ServiceCore, Samples]:
    """Attempt 0 steps 5-10 (all accounted before the rollback when nothing is held), then
    attempt 1 re-runs from step 9; the run finishes."""
    core = _service(state, hold_steps)
    for n in range(5, 11):
        core.publish(step_records(n))
    accounted = 6 - hold_steps
    wait_for(lambda: core.goodput.runs.get(RUN) is not None
             and core.goodput.runs[RUN].steps == accounted, 10, f"{accounted} steps accounted")
    for n in range(9, 12):
        core.publish(step_records(n, attempt=1))
    core.finish_run(RUN)
    return core, scrape(core.metrics)


def _corrected(series: Samples) -> dict[Bucket, float]:
    counted = _by_bucket(series, GOODPUT_SECONDS.name)
    undone = _by_bucket(series, GOODPUT_ROLLED_BACK.name)
    out = dict(counted)
    for bucket, value in undone.items():
        out[bucket] -= value
        out[Bucket.WASTED] = out.get(Bucket.WASTED, 0.0) + value
    return out


@pytest.mark.parametrize("hold_steps", [0, 2])
def test_corrected_live_counters_equal_the_offline_report(tmp_path: Path, hold_steps: int) -> None:
    core, series = _run(tmp_path, hold_steps)
    try:
        undone = _by_bucket(series, GOODPUT_ROLLED_BACK.name)
        if hold_steps == 0:
            # steps 9 and 10 of attempt 0 were counted before attempt 1 re-ran them
            spans = SpanMap()
            want: dict[Bucket, float] = {}
            for n in (9, 10):
                for (_, bucket, _), v in account_step(step_input(n), spans).seconds.items():
                    if bucket in (Bucket.PRODUCTIVE, Bucket.OVERHEAD):
                        want[bucket] = want.get(bucket, 0.0) + v
            assert set(undone) == {Bucket.PRODUCTIVE, Bucket.OVERHEAD}
            for bucket, value in want.items():
                assert undone[bucket] == pytest.approx(value, rel=1e-9)
        else:
            assert undone == {}  # still held when the rollback came: accounted as wasted
        report = build_report(core.history, RUN, GOODPUT)
        live = _corrected(series)
        for bucket in Bucket:
            assert live.get(bucket, 0.0) == pytest.approx(
                report.goodput.get(bucket.value, 0.0), rel=1e-9, abs=1e-9), bucket
        # the ratio gauge does not count the rolled-back work as productive
        assert core.goodput.runs[RUN].goodput == pytest.approx(report.goodput_ratio, rel=1e-9)
    finally:
        core.close(0.0)
