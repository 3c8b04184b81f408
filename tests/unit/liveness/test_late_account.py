"""A rank's time in a stage is what its account says, as of when it said it: a heartbeat that
arrived late (a sender held up connecting to Ray on a loaded machine) is not seconds spent in
the stage, and a rank's skewed clock does not count; a rank that really stays in a stage still
pages at its allowance (``make test-load``'s false ``RunStalled`` "at step 0")."""

from __future__ import annotations

from rlmon.service.contract.heartbeat import Heartbeat, OpenSpan, RankBeat
from rlmon.service.contract.timeline import Span, Timeline
from rlmon.service.liveness.run_state import LivenessTracker, LivenessView, RunState, describe
from rlmon.service.liveness.thresholds import LivenessParams
from rlmon.service.metrics.rank import Rank, World
from tests.unit.liveness.support import T0

PARAMS = LivenessParams(heartbeat_seconds=0.5, stall_floor_seconds=4.0, dead_after_seconds=6.0)
TRAIN = 0.05  # step 0's `train`, as rank 0's partial timed it: its allowance is the floor, 4 s


def _beat(tracker: LivenessTracker, sent: float, since: float, now: float) -> None:
    """Both ranks said at ``sent`` (their clock) they were in train since ``since``; it
    arrived at ``now``."""
    for dp in (0, 1):
        tracker.heartbeat(Heartbeat("r", "actor", World(dp=2), (
            RankBeat(Rank(dp=dp), (OpenSpan("train", since),)),), sent), now)


def _first_partial(tracker: LivenessTracker, at: float) -> None:
    """Rank 0's step 0 arrived (its `train` timed), rank 1's not yet: step 0 is still open."""
    start, end = int((at - TRAIN) * 1e9), int(at * 1e9)
    tracker.heard("r", "actor", Rank(dp=0), 2, at)
    tracker.spans("r", "actor", Timeline(start, end, (Span("train", start, end),)), at, 0)


def _judged(tracker: LivenessTracker, now: float) -> LivenessView:
    tracker.evaluate(now)
    view = tracker.view("r", "actor", now)
    assert view is not None
    return view


def _first_stall(tracker: LivenessTracker, until: float, skew: float = 0.0) -> float | None:
    """Both ranks in train since T0 and saying so every 0.5 s (on a clock ``skew`` seconds off
    this one), judged every 0.1 s: when the run stalled."""
    for tick in range(1, round((until - T0) * 10) + 1):
        now = T0 + tick / 10
        if tick % 5 == 0:
            _beat(tracker, now + skew, T0 + skew, now)
        if _judged(tracker, now).state is RunState.STALLED:
            return now
    return None


def test_a_heartbeat_that_arrived_late_is_not_time_spent_in_its_stage() -> None:
    tracker = LivenessTracker(PARAMS)
    _beat(tracker, T0 + 0.01, T0, T0 + 3.0)  # said at T0 + 0.01, carried 3 s late; no more
    _first_partial(tracker, T0 + 3.2)  # for 5 s, then step 0's partials: the first heard
    for now in (T0 + 3.2, T0 + 7.4, T0 + 8.0):
        assert _judged(tracker, now).state is RunState.RUNNING, now - T0  # 7.1 s paged before
    # the account renewed, in train on the ranks' clock since T0 + 7: it pages 4 s after that
    now = T0 + 8.0
    while now < T0 + 12.0 and _judged(tracker, now).state is not RunState.STALLED:
        now += 0.5
        _beat(tracker, now, T0 + 7.0, now)
    assert 11.0 < now - T0 <= 11.5


def test_a_rank_that_stays_in_a_stage_pages_at_its_allowance() -> None:
    tracker = LivenessTracker(PARAMS)
    _first_partial(tracker, T0 + 0.1)
    stalled = _first_stall(tracker, T0 + 8.0)
    assert stalled is not None and 4.0 < stalled - T0 <= 4.6
    text = describe(_judged(tracker, stalled))
    assert "train for 4." in text, text
    assert "Last step: no step yet, 4." in text and "since first heard" in text, text


def test_a_rank_s_skewed_clock_is_not_time_in_its_stage() -> None:
    """Rank clocks 30 s behind and ahead of this one: the stage is timed on the rank's own
    clock, so both page at the same allowance."""
    for skew in (-30.0, 30.0):
        tracker = LivenessTracker(PARAMS)
        _first_partial(tracker, T0 + 0.1)
        stalled = _first_stall(tracker, T0 + 8.0, skew)
        assert stalled is not None and 4.0 < stalled - T0 <= 4.6, skew


def test_a_rank_whose_account_stops_is_judged_by_its_silence() -> None:
    """A wedged rank (its sender no longer runs): its time in the stage stops two heartbeats
    after its last account; its silence is the dead limit's and the probe's to judge."""
    tracker = LivenessTracker(PARAMS)
    _first_partial(tracker, T0 + 0.1)
    _beat(tracker, T0 + 1.0, T0, T0 + 1.0)
    assert _judged(tracker, T0 + 5.5).state is RunState.RUNNING  # 2 s in train, as far as known
    assert _judged(tracker, T0 + 7.5).state is RunState.DEAD  # silent past the dead limit
