"""The run-metadata channel: ``Reporter.set_run_info`` / ``finish_run`` reach the service, which
exports ``rlmon_run_info``, builds the run's sanity checks from it (DPO, DeepSpeed version) and
warns once per relayed, non-comparable key (no Ray: ServiceCore in-process behind a sink)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pytest

from rlmon.actors.reporter import Reporter
from rlmon.actors.reporter.sink import LocalSink
from rlmon.actors.service_actor import send_to_service
from rlmon.service.contract.run_info import RunInfo
from rlmon.service.contract.step_message import StepMessage
from rlmon.service.export.exporter import MetricsState
from rlmon.service.metrics import catalog, keymaps
from rlmon.service.service_core import ServiceCore
from rlmon.service.spine.sinks import SanitySink
from tests.support.clock import FakeClock
from tests.support.records import step_record
from tests.support.scrape import scrape

LOSS = catalog.get("actor/loss").name


class CoreSink(LocalSink):
    """A LocalSink that publishes finalized steps to an in-process ServiceCore (its hooks too)."""

    def __init__(self, core: ServiceCore) -> None:
        super().__init__(on_record=lambda record: core.publish([record]))
        self.core = core

    def send(self, messages: Sequence[StepMessage]) -> None:
        super().send(messages)

    def set_run_info(self, run: str, info: RunInfo) -> None:
        self.core.set_run_info(run, info)

    def finish_run(self, run: str) -> None:
        self.core.finish_run(run)


def _info_labels(state: MetricsState, run: str) -> dict[str, str]:
    for (name, labels), _ in scrape(state).items():
        if name == "rlmon_run_info" and dict(labels).get("run") == run:
            return dict(labels)
    return {}


def test_reporter_run_info_reaches_the_exporter_and_finish_run_expires_it() -> None:
    core = ServiceCore()
    try:
        rep = Reporter("dpo-1", "actor", rank={"dp": 0}, world={"dp": 1}, sink=CoreSink(core),
                       step_seconds=False)
        rep.set_run_info(framework="trl", framework_version="0.19.0", algorithm="dpo",
                         dp=1, deepspeed_version="0.14.0")
        labels = _info_labels(core.metrics, "dpo-1")
        assert labels["framework"] == "trl"
        assert labels["algorithm"] == "dpo"
        assert labels["deepspeed_version"] == "0.14.0"
        assert labels["dpo"] == "false"
        rep.finish_run()
        assert "dpo-1" in core.metrics._finished
        rep.close()
    finally:
        core.close()


def test_unknown_run_info_field_is_a_type_error_and_local_sink_is_a_no_op() -> None:
    rep = Reporter("r", "actor", rank={"dp": 0}, world={"dp": 1}, sink=LocalSink(),
                   step_seconds=False)
    try:
        with pytest.raises(TypeError, match="framwork"):
            rep.set_run_info(framwork="trl")
        rep.set_run_info(framework="trl")  # LocalSink: no service, nothing to do
        rep.finish_run()
        assert send_to_service(LocalSink(), "set_run_info", "r", RunInfo()) is False
    finally:
        rep.close()


def test_dpo_metadata_turns_on_the_ln2_check() -> None:
    core = ServiceCore()
    try:
        core.set_run_info("dpo", {"algorithm": "DPO"})
        core.set_run_info("ppo", RunInfo(algorithm="ppo"))
        for run in ("dpo", "ppo"):
            core.publish([step_record(run=run, step=s, metrics={LOSS: math.log(2.0)})
                          for s in range(6)])
        found = [(f.kind.value, f.metric) for f in core.spine.sinks[SanitySink].findings]
        assert found == [("DPOLossAtLn2", LOSS)]  # ppo at ln 2 is no finding
        # metadata that arrives after the first steps still applies to the live checker
        core.publish([step_record(run="late", step=0, metrics={LOSS: 0.1})])
        core.set_run_info("late", RunInfo(dpo=True))
        core.publish([step_record(run="late", step=s, metrics={LOSS: math.log(2.0)})
                      for s in range(1, 7)])
        assert core.spine.sinks[SanitySink].counts["DPOLossAtLn2"] == 2
    finally:
        core.close()


def test_deepspeed_version_from_metadata_annotates_nan_grad_norm() -> None:
    grad = catalog.GRAD_NORM
    core = ServiceCore()
    try:
        core.set_run_info("ds", RunInfo(framework="openrlhf", deepspeed_version="0.14.0"))
        core.publish([step_record(run="ds", step=0, metrics={grad: math.nan})])
        core.publish([step_record(run="plain", step=0, metrics={grad: math.nan})])
        assert [(f.kind.value, f.known_bug) for f in core.spine.sinks[SanitySink].findings] == [
            ("GradNormNaNKnownDeepSpeedBug", True)]
    finally:
        core.close()


def test_relayed_non_comparable_keys_are_warned_once_per_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    relayed = keymaps.relay_name("openrlhf", "policy_loss")
    core = ServiceCore()
    try:
        with caplog.at_level("WARNING", logger="rlmon.sanity"):
            for step in range(3):
                metrics = {relayed: 0.5, LOSS: 0.4, "timing/x_seconds": 1.0}
                core.publish([step_record(run="or", step=step, metrics=metrics)])
        kinds = [(f.kind.value, f.metric) for f in core.spine.sinks[SanitySink].findings]
        assert kinds == [("RelayedKeyNotComparable", relayed)]
        assert core.spine.sinks[SanitySink].counts["RelayedKeyNotComparable"] == 1
        assert relayed in caplog.text
        samples = scrape(core.metrics)
        key = ("rlmon_sanity_findings_total", (("kind", "RelayedKeyNotComparable"),))
        assert samples[key] == 1.0
        # another run relaying the same key gets its own warning
        core.publish([step_record(run="or2", step=0, metrics={relayed: 0.5})])
        assert core.spine.sinks[SanitySink].counts["RelayedKeyNotComparable"] == 2
    finally:
        core.close()


def test_steps_finalized_just_after_finish_keep_the_run_finished() -> None:
    clock = FakeClock(0.0)
    state = MetricsState(run_ttl=600, finished_ttl=10, clock=clock)
    rec = step_record(step=0, metrics={LOSS: 1.0})
    state.update(rec)
    state.finish_run("r")
    clock.now = 2.0  # the tail step the aggregator finalized after the Reporter said "finished"
    state.update(step_record(step=1, metrics={LOSS: 1.0}))
    clock.now = 12.5
    assert state.snapshot().streams == []
    clock.now = 100.0  # much later: the run resumed and shows again
    state.update(step_record(step=2, metrics={LOSS: 1.0}))
    clock.now = 200.0
    assert len(state.snapshot().streams) == 1


def test_service_actor_exposes_run_info_methods() -> None:
    pytest.importorskip("ray")
    from rlmon.actors.service_actor import service_actor_class

    cls: Any = service_actor_class()
    methods = set(dir(cls))
    assert {"set_run_info", "finish_run"} <= methods


def test_a_runs_tags_reach_the_exporter_and_bad_tags_are_refused_by_name() -> None:
    core = ServiceCore()
    try:
        rep = Reporter("tagged", "actor", rank={"dp": 0}, world={"dp": 1}, sink=CoreSink(core),
                       step_seconds=False)
        rep.set_run_info(framework="verl", tags=["baseline", "7b", "baseline"])
        assert core.spine.memory.run_info["tagged"].tags == ("baseline", "7b")  # in order, once each
        assert _info_labels(core.metrics, "tagged")["tags"] == "baseline,7b"
        for bad, why in (("baseline", "a list of strings"), (["a,b"], "'a,b' is not a tag"),
                         ([" a"], "' a' is not a tag"), ([""], "'' is not a tag"),
                         ([7], "7 is not a tag"), ([f"t{i}" for i in range(33)], "33 tags")):
            with pytest.raises(ValueError, match=f"RunInfo.tags: {why}"):
                rep.set_run_info(tags=bad)
        assert core.spine.memory.run_info["tagged"].tags == ("baseline", "7b")  # nothing sent
        rep.close()
    finally:
        core.close()
