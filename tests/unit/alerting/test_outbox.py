"""The SQLite outbox: store before send, dedup, ordering, backoff, persistence across reopen."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from rlmon.service.alerting.notify.message import Notification
from rlmon.service.alerting.notify.outbox import Backoff, Outbox
from tests.support.clock import FakeClock


def note(key: str, order: str = "run/actor", dest: str = "slack") -> Notification:
    return Notification(dest, key, order, {"text": key})


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def test_dedup_before_and_after_delivery(tmp_path: Path, clock: FakeClock) -> None:
    box = Outbox(tmp_path / "o.sqlite", clock=clock)
    assert box.put(note("a"))
    assert not box.put(note("a"))  # pending
    (row,) = box.due("slack")
    box.ack(row)
    assert not box.put(note("a"))  # delivered already
    counters = box.counters()
    assert (counters.sent, counters.pending, counters.duplicates) == (1, 0, 2)


def test_order_key_serializes_and_destinations_do_not_block_each_other(
    tmp_path: Path, clock: FakeClock
) -> None:
    box = Outbox(tmp_path / "o.sqlite", clock=clock, backoff=Backoff(10, 100, 0))
    box.put(note("trigger", order="r/a/X", dest="pagerduty"))
    box.put(note("resolve", order="r/a/X", dest="pagerduty"))
    box.put(note("other", order="r/a/Y", dest="pagerduty"))
    box.put(note("chat", dest="slack"))
    due = [r.notification.key for r in box.due("pagerduty")]
    assert due == ["trigger", "other"]  # the resolve waits for its trigger
    trigger = box.due("pagerduty")[0]
    assert box.retry(trigger, "HTTP 503") == 10
    assert [r.notification.key for r in box.due("pagerduty")] == ["other"]
    assert [r.notification.key for r in box.due("slack")] == ["chat"]
    clock.now += 10
    assert next(r.notification.key for r in box.due("pagerduty")) == "trigger"


def test_backoff_grows_with_jitter_and_cap() -> None:
    backoff = Backoff(initial=1.0, maximum=30.0, jitter=0.2)
    rng = random.Random(3)
    delays = [backoff.delay(n, rng) for n in range(1, 9)]
    for n, delay in enumerate(delays, start=1):
        base = min(30.0, 2.0 ** (n - 1))
        assert base * 0.8 <= delay <= base * 1.2
    assert len({round(d, 6) for d in delays}) == len(delays)  # jittered, not identical


def test_retry_after_is_a_floor(tmp_path: Path, clock: FakeClock) -> None:
    box = Outbox(tmp_path / "o.sqlite", clock=clock, backoff=Backoff(0.1, 1, 0))
    box.put(note("a"))
    (row,) = box.due("slack")
    assert box.retry(row, "429", after=7.0) == 7.0
    assert box.due("slack") == []
    clock.now += 7.0
    assert len(box.due("slack")) == 1


def test_pending_rows_and_schedule_survive_reopen(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "o.sqlite"
    box = Outbox(path, clock=clock, backoff=Backoff(5, 50, 0))
    for key in "abc":
        box.put(note(key, order=key))
    row = box.due("slack")[0]
    box.retry(row, "connection refused")
    box.close()  # the process goes away
    again = Outbox(path, clock=clock)
    assert again.pending() == 3
    assert [r.notification.key for r in again.due("slack")] == ["b", "c"]
    clock.now += 5
    rows = again.due("slack")
    assert [r.notification.key for r in rows] == ["a", "b", "c"]
    assert rows[0].attempts == 1
    assert again.counters().retried == 1  # counters persist too


def test_permanent_failure_and_give_up(tmp_path: Path, clock: FakeClock) -> None:
    box = Outbox(tmp_path / "o.sqlite", clock=clock, give_up_after=60, backoff=Backoff(1, 1, 0))
    box.put(note("bad", order="1"))
    box.put(note("old", order="2"))
    bad, old = box.due("slack")
    box.fail(bad, "HTTP 400: invalid_payload")
    clock.now += 61
    assert box.retry(old, "HTTP 503") == -1.0
    assert box.pending() == 0
    assert [(k, e[:8]) for k, _, e in box.failed_rows()] == [("bad", "HTTP 400"),
                                                             ("old", "gave up ")]
    assert box.counters().failed == 2
    assert not box.put(note("bad"))  # a failed key is not resubmitted either


def test_sent_memory_is_bounded(tmp_path: Path, clock: FakeClock) -> None:
    box = Outbox(tmp_path / "o.sqlite", clock=clock, sent_memory=2)
    for key in "abc":
        clock.now += 1
        box.put(note(key, order=key))
        box.ack(box.due("slack")[0])
    assert box.put(note("a"))  # forgotten: only the 2 newest delivered keys are kept
    assert not box.put(note("c"))


def test_a_claimed_row_has_one_owner_until_settled(tmp_path: Path, clock: FakeClock) -> None:
    box = Outbox(tmp_path / "o.sqlite", clock=clock)
    box.put(note("a", order="r1/actor"))
    box.put(note("b", order="r1/actor"))
    box.put(note("c", order="r2/actor"))
    (first,) = box.claim("slack")
    assert first.notification.key == "a"
    # the claimed head still blocks its order key; the other key is free
    assert [r.notification.key for r in box.claim("slack", limit=16)] == ["c"]
    assert box.claim("slack") == []
    assert box.due("slack") == []
    box.release(first)  # given back unsent: claimable again
    (again,) = box.claim("slack")
    assert again.id == first.id
    box.ack(again)  # settling releases
    assert [r.notification.key for r in box.claim("slack")] == ["b"]


def test_failed_memory_is_bounded(tmp_path: Path, clock: FakeClock) -> None:
    box = Outbox(tmp_path / "o.sqlite", clock=clock, sent_memory=2)
    for key in "abc":
        clock.now += 1
        box.put(note(key, order=key))
        box.fail(box.due("slack")[0], "HTTP 400")
    assert [k for k, _, _ in box.failed_rows()] == ["b", "c"]  # the 2 newest failures stay
    assert box.counters().failed == 3  # every one counted
