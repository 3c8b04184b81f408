"""StragglerRank: a deliberately slow rank, found from the ranks' timelines, named with the
span behind it in the alert's notification; the rule is in the default pack, its threshold in
the catalog, and another rank being slowest starts the count over."""

from __future__ import annotations

import time
import types
from pathlib import Path

import pytest

from rlmon.actors.reporter import Reporter
from rlmon.actors.reporter import facade as reporter_module
from rlmon.actors.reporter.sink import LocalSink
from rlmon.service.alerting.engine import AlertEngine
from rlmon.service.alerting.rules import Condition, default_rules
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.contract.timeline import Straggler
from rlmon.service.metrics import catalog
from rlmon.service.metrics.rank import Rank
from rlmon.service.service_core import ServiceCore
from tests.support.alerting_support import Receiver, wait_for, webhook_settings
from tests.support.clock import FakeClock
from tests.support.records import step_record

S = 1_000_000_000


def test_straggler_notification_names_the_slow_rank_and_span(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    clock = FakeClock(0)
    monkeypatch.setattr(reporter_module, "time", types.SimpleNamespace(
        perf_counter_ns=clock, time=time.time, monotonic=time.monotonic))
    receiver = Receiver().start()
    settings = webhook_settings(receiver, tmp_path / "outbox.sqlite")
    service = ServiceCore(settings, state_dir=tmp_path).start()
    sink = LocalSink(on_record=lambda record: service.publish([record]))
    reps = [Reporter("grpo", "actor", rank={"dp": d}, world={"dp": 4}, sink=sink)
            for d in range(4)]
    spec = catalog.STRAGGLER_ALERT
    try:
        for step in range(spec.for_steps):
            for d, rep in enumerate(reps):
                clock.now = step * 20 * S  # every rank starts the step together...
                with rep.span("rollout"):
                    with rep.span("generate", engine="vllm"):
                        clock.advance((12 if d == 2 else 4) * S)  # rank dp=2 generates slowly
                    with rep.span("reward"):
                        clock.advance(S)
                with rep.span("train"):
                    clock.advance(5 * S)
                clock.now = (step + 1) * 20 * S  # ... and ends it together (a collective waits)
                rep.end_step(step)
            for rep in reps:
                assert rep.flush(5)
        hooks = wait_for(lambda: receiver.accepted("/hook"), 10, "the straggler notification")
        (alert,) = hooks[0].body["alerts"]
        assert alert["alert"] == spec.name and alert["state"] == "firing"
        assert alert["step"] == spec.for_steps - 1  # the for_steps-th slow step in a row
        assert alert["metric"] == catalog.STRAGGLER_METRIC
        assert alert["value"] == pytest.approx(18 / 10)  # busy 18 s against the median 10 s
        assert "rank dp=2 cp=0 tp=0 pp=0" in alert["detail"]
        assert "span 'generate' took 8 s longer" in alert["detail"]  # the deepest slow span
        assert alert["detail"] in alert["text"]
        stored = service.history.timelines("grpo", "actor")
        assert [t.step for t in stored] == list(range(spec.for_steps))
    finally:
        for rep in reps:
            rep.close()
        service.close()
        receiver.stop()


def _record(step: int, slow: int | None, ratio: float = 3.0) -> StepRecord:
    found = None if slow is None else Straggler(Rank(dp=slow), ratio, ratio, 1.0, "gen", 2.0)
    return step_record(step=step, ranks_expected=4, straggler=found)


def test_the_same_rank_must_be_slowest_for_n_steps() -> None:
    (rule,) = [r for r in default_rules() if r.name == catalog.STRAGGLER_ALERT.name]
    assert rule.condition is Condition.STRAGGLER_RANK
    assert rule.threshold == catalog.STRAGGLER_ALERT.threshold
    assert rule.for_steps == catalog.STRAGGLER_ALERT.for_steps == 5
    engine = AlertEngine([rule])
    # ranks 1 and 2 take turns being slow: never the same rank 5 steps in a row
    fired = [e for s in range(10) for e in engine.evaluate(_record(s, 1 + s % 2))]
    assert fired == []
    # below the factor: not a straggler
    fired = [e for s in range(10, 20) for e in engine.evaluate(_record(s, 3, ratio=1.4))]
    assert fired == []
    events = [e for s in range(20, 25) for e in engine.evaluate(_record(s, 3))]
    assert [(e.step, e.state) for e in events] == [(24, "firing")]
    assert "dp=3" in events[0].detail
    events = [e for s in range(25, 30) for e in engine.evaluate(_record(s, None))]
    assert events == []  # no timelines: nothing to say either way
    # hysteresis: resolved after the catalog's RESOLVE_AFTER good steps in a row
    good = range(30, 30 + catalog.RESOLVE_AFTER)
    events = [e for s in good for e in engine.evaluate(_record(s, 3, ratio=1.0))]
    assert [(e.step, e.state) for e in events] == [(good[-1], "resolved")]
