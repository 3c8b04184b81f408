"""Liveness states by time on an injected clock: running, slow, stalled, dead, finished."""

from __future__ import annotations

from rlmon.service.contract.timeline import Span, Timeline
from rlmon.service.liveness.run_state import LivenessTracker, RunState, describe
from rlmon.service.liveness.thresholds import LivenessParams
from rlmon.service.metrics.rank import Rank
from tests.unit.liveness.support import T0, beat

P = LivenessParams()


class Run:
    """A simulated run of ``world`` ranks stepping every ``period`` seconds."""

    def __init__(self, tracker: LivenessTracker, world: int = 2, period: float = 2.0,
                 name: str = "r") -> None:
        self.tracker, self.world, self.period, self.name = tracker, world, period, name
        self.now, self.step = T0, 0
        self.states: list[tuple[float, RunState]] = []

    def advance(self, seconds: float, *, steps: bool = True, beats: bool = True,
                spans: dict[int, tuple[str, float]] | None = None, alive: int | None = None,
                every: float = 1.0) -> None:
        end = self.now + seconds
        next_step = self.now + self.period
        while self.now < end:
            self.now = min(self.now + every, end)
            if steps and self.now >= next_step:
                for dp in range(self.world):
                    self.tracker.heard(self.name, "actor", Rank(dp=dp), self.world, self.now)
                self.tracker.finalized(self.name, "actor", self.step, self.now)
                self.step += 1
                next_step += self.period
            if beats:
                for dp in range(self.world if alive is None else alive):
                    span = (spans or {}).get(dp)
                    self.tracker.heartbeat(beat(self.name, dp, self.world,
                                                (span,) if span else (), self.step - 1,
                                                self.now), self.now)
            for view in self.tracker.evaluate(self.now):
                self.states.append((self.now, view.state))

    def state(self) -> RunState:
        view = self.tracker.view(self.name, "actor", self.now)
        assert view is not None
        return view.state


def test_a_healthy_run_stays_running() -> None:
    run = Run(LivenessTracker())
    run.advance(600)
    assert [s for _, s in run.states] == [RunState.RUNNING]


def test_a_hang_with_heartbeats_is_stalled_after_the_floor_and_resolves_on_the_next_step() -> None:
    run = Run(LivenessTracker())
    run.advance(60)
    stopped = run.now
    run.advance(200, steps=False, spans={0: ("generate", stopped), 1: ("generate", stopped)})
    stalled = [t for t, s in run.states if s is RunState.STALLED]
    assert stalled and P.stall_floor_seconds < stalled[0] - stopped <= P.stall_floor_seconds + 3
    assert run.state() is RunState.STALLED
    run.advance(3)
    assert run.state() is RunState.RUNNING


def test_silence_of_every_rank_is_dead_and_a_clean_close_is_finished() -> None:
    tracker = LivenessTracker()
    run = Run(tracker)
    run.advance(60)
    stopped = run.now
    run.advance(60, steps=False, beats=False)
    dead = [t for t, s in run.states if s is RunState.DEAD]
    assert dead and dead[0] - stopped <= P.dead_after_seconds + 2
    other = Run(tracker, name="done")
    other.advance(60)
    for dp in range(2):
        tracker.heartbeat(beat("done", dp, 2, at=other.now, closing=True), other.now)
    other.advance(600, steps=False, beats=False)
    assert other.state() is RunState.FINISHED
    assert RunState.STALLED not in [s for _, s in other.states]


def test_a_stream_without_heartbeats_is_never_called_dead() -> None:
    run = Run(LivenessTracker())
    run.advance(60, beats=False)
    run.advance(300, steps=False, beats=False)
    assert run.state() is RunState.STALLED


def test_ten_minute_steps_never_stall_and_a_tenfold_slowdown_is_slow() -> None:
    run = Run(LivenessTracker(), period=600.0)
    run.advance(6 * 3600, every=5.0)
    assert [s for _, s in run.states] == [RunState.RUNNING]
    fast = Run(LivenessTracker(), period=2.0, name="fast")
    fast.advance(120)
    fast.period = 20.0
    fast.advance(200)
    assert RunState.SLOW in [s for _, s in fast.states]
    assert RunState.STALLED not in [s for _, s in fast.states]


def test_one_rank_stuck_in_its_stage_while_the_others_wait_is_named() -> None:
    tracker = LivenessTracker()
    run = Run(tracker, world=4, period=10.0)
    for _ in range(20):  # the timelines say reward usually takes 2 s
        tracker.spans("r", "actor", Timeline(0, 10**9, (Span("reward", 0, 2 * 10**9),)), run.now)
    run.advance(100)
    stopped = run.now
    spans = {0: ("reward", stopped), 1: ("allreduce", stopped + 2),
             2: ("allreduce", stopped + 2), 3: ("allreduce", stopped + 2)}
    run.advance(70, steps=False, spans=spans)
    view = tracker.view("r", "actor", run.now)
    assert view is not None and view.stuck is not None
    assert view.stuck.rank == Rank(dp=0) and view.stuck.stage == "reward"
    assert view.odd == (Rank(dp=0),)
    text = describe(view)
    assert "reward" in text and "allreduce" in text and "dp=0" in text
    assert "Last step: step 9" in text  # the cost is the alert's own (tests/unit/goodput)


def test_the_text_of_a_fast_run_killed_says_its_period_and_who_is_silent() -> None:
    """Seen trying it: a run of 0.4 s steps read 'typical step 0s' and '(silent) for 30s'."""
    tracker = LivenessTracker()
    run = Run(tracker, world=2, period=0.4, name="fast")
    run.advance(20, every=0.2)
    run.advance(60, steps=False, beats=False)  # SIGKILLed: no step, no heartbeat
    view = tracker.view("fast", "actor", run.now)
    assert view is not None and view.state is RunState.DEAD
    text = describe(view)
    assert "(typical step 0.4s)" in text, text
    assert text.startswith("no heartbeat for 1m00s: 2 ranks (dp=0, dp=1)"), text


def test_knowledge_survives_a_dump_and_load() -> None:
    tracker = LivenessTracker()
    run = Run(tracker)
    run.advance(60)
    run.advance(200, steps=False)
    assert run.state() is RunState.STALLED
    restored = LivenessTracker()
    restored.load(tracker.dump())
    assert restored.evaluate(run.now) == []  # the same state: nothing new to say
    view = restored.view("r", "actor", run.now)
    assert view is not None and view.state is RunState.STALLED


def test_the_pace_is_the_ranks_own_not_the_arrivals() -> None:
    """Steps of a steady 1 s that reach the aggregator in bunches (a loaded machine, a batched
    delivery: five at once every 5 s) are not slow; a real slowdown in when the ranks ended
    them is, however evenly those steps arrive."""
    tracker = LivenessTracker(LivenessParams(stall_floor_seconds=30))
    now, step, states = T0, 0, []
    for _bunch in range(40):
        now += 5.0
        for i in range(5):  # happened 1 s apart, arrive together
            tracker.heard("bunched", "actor", Rank(dp=0), 1, now)
            tracker.finalized("bunched", "actor", step, now, happened=now - 5.0 + i + 1)
            step += 1
        states += [v.state for v in tracker.evaluate(now)]
    assert set(states) == {RunState.RUNNING}
    view = tracker.view("bunched", "actor", now)
    assert view is not None and view.period == 1.0
    for i in range(10):  # now each step took 4 s, arriving every 1 s (a backlog draining)
        now += 1.0
        tracker.heard("bunched", "actor", Rank(dp=0), 1, now)
        tracker.finalized("bunched", "actor", step, now, happened=now - 5.0 + 4.0 * (i + 1))
        step += 1
        states += [v.state for v in tracker.evaluate(now)]
    assert RunState.SLOW in states


def test_without_the_ranks_time_the_pace_is_the_arrivals() -> None:
    tracker = LivenessTracker()
    for step in range(12):
        tracker.finalized("old", "actor", step, T0 + 2.0 * step)  # an older producer: no time
    view = tracker.view("old", "actor", T0 + 22.0)
    assert view is not None and view.period == 2.0
    unset = LivenessTracker()
    for step in range(12):  # a producer that sends 0.0 for the time: unset, not 1970
        unset.finalized("unset", "actor", step, T0 + 3.0 * step, happened=0.0)
    view = unset.view("unset", "actor", T0 + 33.0)
    assert view is not None and view.period == 3.0
