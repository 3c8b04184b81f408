"""The dispatcher: alert events in, deliveries out, through the durable outbox.

``submit`` routes events and writes the notifications to the outbox (nothing is sent before it is
stored). Delivery runs either synchronously (``pump``/``drain``, for the CLI and tests) or on one
background thread per destination (``start``), so a slow Slack never delays a PagerDuty page.
Each destination is paced by its ``min_interval`` and paused by a 429's Retry-After. Every
deliverer claims the row it sends from the outbox, so the threads and a synchronous drain never
send the same row twice; ``shutdown`` stops the threads first and then drains alone.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rlmon.service.alerting.alert_types import AlertEvent
from rlmon.service.alerting.notify.grouping import Groups, is_member, is_urgent, member_events
from rlmon.service.alerting.notify.message import Delivery, Notifier
from rlmon.service.alerting.notify.outbox import Outbox, PendingRow
from rlmon.service.alerting.notify.routing import route
from rlmon.service.clock import Clock
from rlmon.service.config import Settings
from rlmon.service.crash_points import crash_point
from rlmon.service.redact import Redactor

__all__ = ["DispatchStats", "Dispatcher"]

log = logging.getLogger("rlmon.notify")



@dataclass(frozen=True, slots=True)
class DispatchStats:
    """Outcomes since this dispatcher started, per (destination, outcome), and the outbox depth."""

    outcomes: Mapping[tuple[str, str], int]
    pending: Mapping[str, int]
    silenced: int
    unroutable: Mapping[str, int]


class Dispatcher:
    def __init__(
        self, settings: Settings, outbox: Outbox, notifiers: Iterable[Notifier],
        *, clock: Clock | None = None, redactor: Redactor | None = None,
        state_dir: str | None = None,
    ) -> None:
        self.settings = settings
        self.state_dir = state_dir  # the service's: notifications name it in commands they quote
        self.outbox = outbox
        self.notifiers: dict[str, Notifier] = {n.name: n for n in notifiers}
        self._clock: Clock = clock or time.time
        self._redact = redactor or settings.redactor()
        self._lock = threading.Lock()
        self._outcomes: dict[tuple[str, str], int] = {}
        self._silenced = 0
        self._unroutable: dict[str, int] = {}
        self._not_before: dict[str, float] = {}
        self._wake = {name: threading.Event() for name in self.notifiers}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.latencies: deque[float] = deque(maxlen=1000)  # finalization -> accepted, seconds
        # Slack and webhook, per run; the groups' state kept in the outbox's file
        self.groups = Groups(settings.notifiers.grouping, outbox, self._clock())

    def destinations(self) -> list[str]:
        """The receivers alerts can reach, for the start-up announcement."""
        receivers = sorted(n for n in self.notifiers if n != "console")
        if "console" in self.notifiers:
            receivers.append("console" if receivers else "console (no receiver configured)")
        return receivers

    # --- intake ----------------------------------------------------------------------------------

    def submit(
        self, events: Iterable[AlertEvent], finalized_at: float | None = None, wake: bool = True,
    ) -> int:
        """Route and store the events' notifications; returns how many new ones were stored.

        ``wake`` False leaves the delivery threads asleep until :meth:`wake` (a caller that
        commits more after the outbox starts delivery once everything is committed)."""
        batch = list(events)
        if not batch:
            return 0
        created = self._clock() if finalized_at is None else finalized_at
        routed = route(batch, self.settings, self.notifiers.keys(), created, self.state_dir)
        stored = 0
        now = self._clock()
        for notification in routed.notifications:
            if self.outbox.put(notification, due=self.groups.due(notification, now),
                               hasten=is_urgent(notification.body)):
                stored += 1
                if wake:
                    self._wake[notification.destination].set()
        with self._lock:
            self._silenced += routed.silenced
            for dest, n in routed.unroutable.items():
                if dest not in self._unroutable:
                    log.warning("alerts routed to %s, which is not configured: not sent there "
                                "(counted as outcome 'unroutable')", dest)
                self._unroutable[dest] = self._unroutable.get(dest, 0) + n
        return stored

    def wake(self) -> None:
        """Have every delivery thread look at the outbox now."""
        for event in self._wake.values():
            event.set()

    # --- delivery --------------------------------------------------------------------------------

    def _count(self, destination: str, outcome: str) -> None:
        with self._lock:
            key = (destination, outcome)
            self._outcomes[key] = self._outcomes.get(key, 0) + 1

    def _deliver(self, notifier: Notifier, row: PendingRow, point: str) -> Delivery:
        """Send one claimed row (with the rest of its group, when it is a member of a run's
        group: one message) and settle them (ack, retry or fail), which releases the claims."""
        rows = [row]
        try:
            if is_member(row.notification.body):
                rows += self.outbox.claim_group(row)
            return self._settle(notifier, rows, point)
        finally:
            for each in rows:  # settled rows are released already; this covers a raise
                self.outbox.release(each)

    def _body(self, notifier: Notifier, rows: list[PendingRow]) -> dict[str, Any]:
        head = rows[0].notification
        if not is_member(head.body):
            return head.body
        events = [e for r in rows for e in member_events(r.notification.body)]
        return self.groups.body(notifier.name, head.order_key, events, self.settings,
                                self.state_dir, self._clock())

    def _settle(self, notifier: Notifier, rows: list[PendingRow], point: str) -> Delivery:
        dest = notifier.name
        row = rows[0]
        crash_point(point)
        try:
            result = notifier.send(self._body(notifier, rows))
        except Exception as exc:  # a notifier bug must not kill the delivery thread
            result = Delivery("retry", f"{type(exc).__name__}: {exc}")
        now = self._clock()
        pause = now + notifier.min_interval
        if result.outcome == "ok":
            for each in rows:
                self.outbox.ack(each)
            if is_member(row.notification.body):
                self.groups.sent(dest, row.notification.order_key, now, result.thread)
            self._count(dest, "sent")
            if row.notification.created:
                self.latencies.append(now - row.notification.created)
        elif result.outcome == "retry":
            detail = self._redact(result.detail)
            delays = [self.outbox.retry(each, detail, result.after) for each in rows]
            if delays[0] < 0:
                self._count(dest, "failed")
                log.error("%s: gave up on %s: %s", dest, row.notification.key, detail)
            else:
                self._count(dest, "retried")
                log.warning("%s: delivery failed (%s); retry in %.2fs", dest, detail, delays[0])
            if result.after is not None:
                pause = max(pause, now + result.after)  # the receiver's rate limit is per endpoint
        else:
            detail = self._redact(result.detail)
            for each in rows:
                self.outbox.fail(each, detail)
            self._count(dest, "failed")
            log.error("%s: receiver rejected %s: %s", dest, row.notification.key, detail)
        self._not_before[dest] = pause
        return result

    def pump(self, now: float | None = None) -> int:
        """One synchronous pass: deliver what is due and allowed by pacing. Returns attempts."""
        attempts = 0
        for name, notifier in self.notifiers.items():
            while True:
                current = self._clock() if now is None else now
                if current < self._not_before.get(name, 0.0):
                    break
                rows = self.outbox.claim(name, current)
                if not rows:
                    break
                attempts += 1
                self._deliver(notifier, rows[0], "drain.sending")
        return attempts

    def drain(self, timeout: float) -> bool:
        """Deliver until nothing deliverable is pending or ``timeout`` passes; True if drained."""
        deadline = time.monotonic() + timeout
        while True:
            if not any(self.outbox.pending(name) for name in self.notifiers):
                return True
            if time.monotonic() >= deadline:
                return False
            if self.pump() == 0:
                wait = min(self._wait_for(name) for name in self.notifiers)
                # not self._stop.wait: a shutdown drains after the threads were told to stop
                time.sleep(max(0.001, min(wait, deadline - time.monotonic(), 0.5)))

    def shutdown(self, timeout: float) -> bool:
        """Graceful stop: let the threads finish the sends they are in, stop them, then drain
        what is left synchronously (one deliverer), all within ``timeout``; True if drained."""
        deadline = time.monotonic() + timeout
        self.stop(timeout)
        return self.drain(max(0.0, deadline - time.monotonic()))

    def _wait_for(self, name: str) -> float:
        now = self._clock()
        due = self.outbox.next_due(name)
        if due is None:
            return 3600.0
        return max(0.0, max(due, self._not_before.get(name, 0.0)) - now)

    # --- background ------------------------------------------------------------------------------

    def start(self) -> None:
        """One delivery thread per destination (idempotent)."""
        if self._threads:
            return
        self._stop.clear()
        for name in self.notifiers:
            thread = threading.Thread(target=self._loop, args=(name,), daemon=True,
                                      name=f"rlmon-notify-{name}")
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        for event in self._wake.values():
            event.set()
        for thread in self._threads:
            thread.join(timeout)
        self._threads = []

    def dead_threads(self) -> list[str]:
        """Delivery threads that were started and have stopped without ``stop`` (for health)."""
        if self._stop.is_set():
            return []
        return [t.name for t in self._threads if not t.is_alive()]

    def _loop(self, name: str) -> None:
        notifier, wake = self.notifiers[name], self._wake[name]
        while not self._stop.is_set():
            try:
                wake.clear()
                now = self._clock()
                if now >= self._not_before.get(name, 0.0):
                    rows = self.outbox.claim(name, now)
                    if rows:
                        self._deliver(notifier, rows[0], "deliver.sending")
                        continue
                wake.wait(min(self._wait_for(name), 5.0))
            except Exception:  # keep delivering; the outbox still holds the rows
                log.exception("%s: delivery loop error", name)
                self._stop.wait(1.0)

    # --- introspection ---------------------------------------------------------------------------

    def stats(self) -> DispatchStats:
        pending = self.outbox.pending_by_destination()
        with self._lock:
            # what no configured destination could take is exported with the delivery outcomes
            outcomes = {**self._outcomes,
                        **{(dest, "unroutable"): n for dest, n in self._unroutable.items()}}
            return DispatchStats(outcomes, pending, self._silenced, dict(self._unroutable))
