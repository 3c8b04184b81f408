"""The first steps' stall threshold from what the run said: step 0's duration, else the open
span's kind (a long first wait in loading or compiling, a short one in a weight sync)."""

from __future__ import annotations

from rlmon.service.contract.heartbeat import Heartbeat, OpenSpan, RankBeat
from rlmon.service.contract.timeline import Span, Timeline
from rlmon.service.liveness.run_state import LivenessTracker, RunState
from rlmon.service.liveness.thresholds import LivenessParams, SpanKind, span_kind
from rlmon.service.metrics.rank import Rank, World
from tests.unit.liveness.support import T0

WORLD = 2


def _beat(spans: tuple[tuple[str, float], ...], now: float, dp: int) -> Heartbeat:
    return Heartbeat("r", "actor", World(dp=WORLD),
                     (RankBeat(Rank(dp=dp), tuple(OpenSpan(n, s) for n, s in spans)),), now)


class FirstSteps:
    """Two ranks heartbeating every second from T0; steps finalized when told."""

    def __init__(self, params: LivenessParams | None = None) -> None:
        self.tracker = LivenessTracker(params)
        self.now = T0
        self.step = 0
        self.stalled_at: float | None = None

    def finalize(self, seconds: float, stages: tuple[tuple[str, float], ...] = ()) -> None:
        """A step of ``seconds`` ends now, its timeline holding ``stages`` back to back."""
        start = int((self.now - seconds) * 1e9)
        spans, at = [], start
        for name, length in stages:
            spans.append(Span(name, at, at + int(length * 1e9)))
            at += int(length * 1e9)
        timeline = Timeline(start, int(self.now * 1e9), tuple(spans))
        for dp in range(WORLD):
            self.tracker.heard("r", "actor", Rank(dp=dp), WORLD, self.now)
            self.tracker.spans("r", "actor", timeline, self.now, self.step)
        self.tracker.finalized("r", "actor", self.step, self.now)
        self.step += 1

    def wait(self, seconds: float, spans: tuple[tuple[str, float], ...] = ()) -> None:
        end = self.now + seconds
        while self.now < end:
            self.now += 1.0
            for dp in range(WORLD):
                self.tracker.heartbeat(_beat(spans, self.now, dp), self.now)
            for view in self.tracker.evaluate(self.now):
                if view.state is RunState.STALLED and self.stalled_at is None:
                    self.stalled_at = self.now


def test_span_kinds_by_whole_words() -> None:
    assert span_kind("load_model") is SpanKind.COLD
    assert span_kind("rollout/generate") is SpanKind.COLD
    assert span_kind("torch.compile") is SpanKind.COLD
    assert span_kind("weight_sync") is SpanKind.SYNC
    assert span_kind("sync-weights") is SpanKind.SYNC
    assert span_kind("nccl_broadcast") is SpanKind.SYNC
    assert span_kind("offload_params") is SpanKind.OTHER  # not "load"
    assert span_kind("async_update") is SpanKind.OTHER  # not "sync"
    assert span_kind("update_actor") is SpanKind.OTHER


def test_a_hang_after_step_0_pages_within_max_2min_5x_step0() -> None:
    run = FirstSteps()
    run.wait(3, (("train", T0),))
    run.finalize(1.0, (("generate", 0.5), ("train", 0.5)))
    done = run.now
    run.wait(300, (("weight_sync", done),))
    assert run.stalled_at is not None
    assert 90 <= run.stalled_at - done <= 120


def test_a_hang_after_step_1_pages_within_the_target() -> None:
    run = FirstSteps()
    run.wait(2)
    run.finalize(1.0)
    run.wait(1)
    run.finalize(1.0)
    done = run.now
    run.wait(300, (("weight_sync", done),))
    assert run.stalled_at is not None and 90 <= run.stalled_at - done <= 120


def test_a_long_step0_bounds_the_next_steps_by_its_own_duration() -> None:
    """Step 0 of 20 minutes (a model load inside it): the next step may take 4x that."""
    run = FirstSteps()
    run.wait(1200, (("load_model", T0),))
    run.finalize(1200.0, (("load_model", 1190.0), ("train", 10.0)))
    done = run.now
    run.wait(4 * 1200 + 30, (("train", done),))
    assert run.stalled_at is not None
    assert 4 * 1200 <= run.stalled_at - done <= 5 * 1200


def test_slow_starts_in_a_cold_span_never_page() -> None:
    for load in (150.0, 1200.0):
        run = FirstSteps()
        run.wait(load, (("load_model", T0),))
        start = run.now
        run.wait(120, (("compile", start),))  # a slow compile, its first time
        run.finalize(load + 120)
        run.wait(1)
        run.finalize(1.0)
        run.wait(60)
        assert run.stalled_at is None, load


def test_a_weight_sync_hang_before_step_0_pages_after_the_sync_allowance() -> None:
    run = FirstSteps()
    run.wait(30, (("load_model", T0),))
    entered = run.now
    run.wait(400, (("weight_sync", entered),))
    assert run.stalled_at is not None
    assert 300 <= run.stalled_at - entered <= 302


def test_a_broadcast_inside_a_load_waits_for_the_load() -> None:
    """Ranks waiting in a collective inside the model load (rank 0 reads, the rest receive)
    are allowed the load's time, not the collective's."""
    run = FirstSteps()
    run.wait(1500, (("load_model", T0), ("broadcast", T0 + 1)))
    assert run.stalled_at is None


def test_the_first_step_settings_are_configurable() -> None:
    params = LivenessParams(cold_span_seconds=60.0, sync_span_seconds=20.0,
                            cold_span_words=("prepare",), stall_floor_seconds=5.0)
    run = FirstSteps(params)
    run.wait(100, (("prepare_engine", T0),))
    assert run.stalled_at is not None and 60 <= run.stalled_at - T0 <= 62
