"""A durable outbox in embedded SQLite: written before delivery, deleted on acceptance.

Why SQLite: a receiver that is down for ten minutes, or a service restart, must lose nothing, and
the service has no database of its own to lean on. Rows carry their retry schedule, so backoff
survives a restart. Delivered keys are remembered (bounded) so a resubmitted notification is not
sent twice. A deliverer *claims* the rows it sends (:meth:`Outbox.claim`): one owner per row at a
time, so a graceful drain running beside the delivery threads never sends a row they are sending.
Claims live in memory: the process that holds the outbox file owns them, and a crash releases them
with everything else. Delivery is at least once only across one window: a crash between the
receiver's acceptance and the delete resends that one row (PagerDuty deduplicates it by
``dedup_key``; webhooks get the same ``key`` again).
"""

from __future__ import annotations

import json
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from rlmon.service.alerting.notify.message import Notification
from rlmon.service.clock import Clock
from rlmon.service.storage.sqlite_db import open_database

__all__ = ["Backoff", "GroupRow", "Outbox", "OutboxCounters", "PendingRow"]


_SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    key TEXT NOT NULL UNIQUE,
    destination TEXT NOT NULL,
    order_key TEXT NOT NULL,
    body TEXT NOT NULL,
    created REAL NOT NULL,
    enqueued REAL NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_at REAL NOT NULL,
    last_error TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS outbox_due ON outbox (destination, next_at);
CREATE TABLE IF NOT EXISTS sent (key TEXT PRIMARY KEY, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS failed (
    key TEXT PRIMARY KEY, destination TEXT NOT NULL, body TEXT NOT NULL,
    attempts INTEGER NOT NULL, at REAL NOT NULL, error TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS groups (
    destination TEXT NOT NULL, order_key TEXT NOT NULL, first REAL NOT NULL, last REAL NOT NULL,
    sent INTEGER NOT NULL, thread TEXT, PRIMARY KEY (destination, order_key));
"""


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with jitter: initial * 2**(attempt-1), capped, +-jitter fraction."""

    initial: float = 1.0
    maximum: float = 300.0
    jitter: float = 0.2

    def delay(self, attempts: int, rng: random.Random | None = None) -> float:
        base = min(self.maximum, self.initial * 2 ** max(0, attempts - 1))
        spread = base * self.jitter
        return max(0.0, base + (rng or random).uniform(-spread, spread))


@dataclass(frozen=True, slots=True)
class PendingRow:
    id: int
    notification: Notification
    attempts: int
    enqueued: float


@dataclass(frozen=True, slots=True)
class GroupRow:
    """What a notification group's next message needs across a restart (:mod:`.grouping`): when
    it began and last sent, how many messages it sent, and the receiver's id of its thread (the
    Slack ts of its first message; None: none yet)."""

    destination: str
    order_key: str
    first: float
    last: float
    sent: int
    thread: str | None = None


@dataclass(frozen=True, slots=True)
class OutboxCounters:
    """Totals over the outbox file's lifetime (they persist across restarts)."""

    sent: int
    retried: int
    failed: int
    pending: int
    duplicates: int


class Outbox:
    """SQLite-backed queue of notifications. Thread-safe; one file may be reopened after a crash."""

    def __init__(
        self, path: str | Path, *, backoff: Backoff | None = None,
        give_up_after: float = 86_400.0, sent_memory: int = 10_000, clock: Clock | None = None,
    ) -> None:
        self.path = str(path)
        self.backoff = backoff or Backoff()
        self.give_up_after = give_up_after
        self.sent_memory = sent_memory
        self._clock: Clock = clock or time.time
        self._lock = threading.Lock()
        self._db = open_database(self.path, _SCHEMA)
        self._claimed: set[int] = set()  # row ids a deliverer is sending now

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # --- notification groups ---------------------------------------------------------------------

    def groups(self, since: float) -> list[GroupRow]:
        """The groups that sent a message at ``since`` or later (those before it have ended)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT destination, order_key, first, last, sent, thread FROM groups "
                "WHERE last >= ? ORDER BY last", (since,)).fetchall()
        return [GroupRow(d, k, float(f), float(la), int(n), t) for d, k, f, la, n, t in rows]

    def save_group(self, group: GroupRow, ended_before: float) -> None:
        """Keep ``group`` (its latest message sent); forget the groups that ended before
        ``ended_before`` (their last message older than the group TTL)."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute("INSERT OR REPLACE INTO groups VALUES (?, ?, ?, ?, ?, ?)", (
                    group.destination, group.order_key, group.first, group.last, group.sent,
                    group.thread))
                self._db.execute("DELETE FROM groups WHERE last < ?", (ended_before,))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    # --- writing ---------------------------------------------------------------------------------

    def _bump(self, name: str, by: int = 1) -> None:
        self._db.execute(
            "INSERT INTO counters(name, value) VALUES (?, ?) "
            "ON CONFLICT(name) DO UPDATE SET value = value + excluded.value", (name, by),
        )

    def put(self, notification: Notification, due: float | None = None,
            hasten: bool = False) -> bool:
        """Store a notification for delivery (from ``due``, unix seconds; None: now); False if
        its key is pending or already delivered. ``hasten``: the rows of its order key queued
        before it are due by then too (they go first, and a group goes as one message; a row
        waiting out a retry's backoff too: a critical alert is worth an early try)."""
        now = self._clock()
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                seen = self._db.execute(
                    "SELECT 1 FROM sent WHERE key = ? UNION ALL SELECT 1 FROM failed WHERE key = ?",
                    (notification.key, notification.key),
                ).fetchone()
                inserted = False
                if seen is None:
                    cur = self._db.execute(
                        "INSERT OR IGNORE INTO outbox (key, destination, order_key, body, created, "
                        "enqueued, next_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (notification.key, notification.destination, notification.order_key,
                         notification.body_json(), notification.created or now, now,
                         now if due is None else due),
                    )
                    inserted = cur.rowcount == 1
                if inserted and hasten:
                    self._db.execute(
                        "UPDATE outbox SET next_at = MIN(next_at, ?) WHERE destination = ? "
                        "AND order_key = ?", (now if due is None else due,
                                              notification.destination, notification.order_key))
                if not inserted:
                    self._bump("duplicates")
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return inserted

    def due(self, destination: str, now: float | None = None, limit: int = 16) -> list[PendingRow]:
        """Rows of one destination that may be sent now: the head of each order key, if due and
        not claimed (a read-only view; deliverers :meth:`claim`)."""
        now = self._clock() if now is None else now
        with self._lock:
            return self._due(destination, now, limit)

    def claim(self, destination: str, now: float | None = None, limit: int = 1) -> list[PendingRow]:
        """Like :meth:`due`, but the rows returned are the caller's until :meth:`ack`,
        :meth:`retry`, :meth:`fail` or :meth:`release`: no other deliverer gets them meanwhile."""
        now = self._clock() if now is None else now
        with self._lock:
            rows = self._due(destination, now, limit)
            self._claimed.update(row.id for row in rows)
        return rows

    def claim_group(self, row: PendingRow, limit: int = 500) -> list[PendingRow]:
        """The rest of a claimed row's group (its destination and order key: a run's grouped
        notifications, :mod:`rlmon.service.alerting.notify.grouping`), due or not, claimed
        too, in order: they go as one message."""
        with self._lock:
            rows = self._db.execute(
                "SELECT id, key, destination, order_key, body, created, attempts, enqueued "
                "FROM outbox WHERE destination = ? AND order_key = ? ORDER BY id LIMIT ?",
                (row.notification.destination, row.notification.order_key,
                 limit + len(self._claimed)),
            ).fetchall()
            out = [PendingRow(r[0], Notification(r[2], r[1], r[3], json.loads(r[4]),
                                                 created=r[5]), r[6], r[7])
                   for r in rows if r[0] not in self._claimed][:limit]
            self._claimed.update(r.id for r in out)
        return out

    def release(self, row: PendingRow) -> None:
        """Give a claimed row back unsent (idempotent; ack, retry and fail release it too)."""
        with self._lock:
            self._claimed.discard(row.id)

    def _due(self, destination: str, now: float, limit: int) -> list[PendingRow]:
        # a claimed head still blocks its order key: the row behind it must not overtake it
        claimed = sorted(self._claimed)
        rows = self._db.execute(
            "SELECT id, key, destination, order_key, body, created, attempts, enqueued "
            "FROM outbox o WHERE destination = ? AND next_at <= ? AND id = ("
            "  SELECT MIN(id) FROM outbox h WHERE h.destination = o.destination"
            f"  AND h.order_key = o.order_key) AND id NOT IN ({', '.join('?' * len(claimed))})"
            " ORDER BY id LIMIT ?",
            (destination, now, *claimed, limit),
        ).fetchall()
        return [
            PendingRow(
                row[0],
                Notification(row[2], row[1], row[3], json.loads(row[4]), created=row[5]),
                row[6], row[7],
            )
            for row in rows
        ]

    def next_due(self, destination: str) -> float | None:
        """When the earliest unclaimed row of a destination becomes due (None: nothing pending)."""
        with self._lock:
            claimed = sorted(self._claimed)
            row = self._db.execute(
                "SELECT MIN(next_at) FROM outbox WHERE destination = ? AND id NOT IN "
                f"({', '.join('?' * len(claimed))})", (destination, *claimed),
            ).fetchone()
        return None if row is None else row[0]

    def destinations(self) -> list[str]:
        with self._lock:
            return [r[0] for r in self._db.execute("SELECT DISTINCT destination FROM outbox")]

    def ack(self, row: PendingRow) -> None:
        """The receiver accepted: delete the row, remember its key."""
        now = self._clock()
        with self._lock:
            self._claimed.discard(row.id)
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute("DELETE FROM outbox WHERE id = ?", (row.id,))
            self._db.execute("INSERT OR REPLACE INTO sent(key, at) VALUES (?, ?)",
                             (row.notification.key, now))
            self._bump("sent")
            if self.sent_memory >= 0:
                self._db.execute(
                    "DELETE FROM sent WHERE key IN (SELECT key FROM sent ORDER BY at DESC "
                    "LIMIT -1 OFFSET ?)", (self.sent_memory,),
                )
            self._db.execute("COMMIT")

    def retry(self, row: PendingRow, error: str, after: float | None = None) -> float:
        """Schedule another attempt (backoff, or ``after`` if longer); returns the delay.

        A row older than ``give_up_after`` is moved to ``failed`` instead (delay -1).
        """
        now = self._clock()
        attempts = row.attempts + 1
        if now - row.enqueued >= self.give_up_after:
            self.fail(row, f"gave up after {attempts} attempts: {error}")
            return -1.0
        delay = self.backoff.delay(attempts)
        if after is not None:
            delay = max(delay, after)
        with self._lock:
            self._claimed.discard(row.id)
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute(
                "UPDATE outbox SET attempts = ?, next_at = ?, last_error = ? WHERE id = ?",
                (attempts, now + delay, error[:500], row.id),
            )
            self._bump("retried")
            self._db.execute("COMMIT")
        return delay

    def fail(self, row: PendingRow, error: str) -> None:
        """Give up on a row (the receiver rejected it for good): keep it in ``failed``."""
        now = self._clock()
        with self._lock:
            self._claimed.discard(row.id)
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute("DELETE FROM outbox WHERE id = ?", (row.id,))
            self._db.execute(
                "INSERT OR REPLACE INTO failed(key, destination, body, attempts, at, error) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (row.notification.key, row.notification.destination,
                 row.notification.body_json(), row.attempts + 1, now, error[:500]),
            )
            self._bump("failed")
            if self.sent_memory >= 0:  # the newest failures stay for inspection, as sent keys do
                self._db.execute(
                    "DELETE FROM failed WHERE key IN (SELECT key FROM failed ORDER BY at DESC "
                    "LIMIT -1 OFFSET ?)", (self.sent_memory,),
                )
            self._db.execute("COMMIT")

    # --- reading ---------------------------------------------------------------------------------

    def pending(self, destination: str | None = None) -> int:
        with self._lock:
            if destination is None:
                return int(self._db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0])
            return int(self._db.execute(
                "SELECT COUNT(*) FROM outbox WHERE destination = ?", (destination,)
            ).fetchone()[0])

    def pending_by_destination(self) -> dict[str, int]:
        with self._lock:
            return dict(self._db.execute(
                "SELECT destination, COUNT(*) FROM outbox GROUP BY destination"
            ).fetchall())

    def counters(self) -> OutboxCounters:
        with self._lock:
            values = dict(self._db.execute("SELECT name, value FROM counters").fetchall())
            pending = int(self._db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0])
        return OutboxCounters(
            sent=values.get("sent", 0), retried=values.get("retried", 0),
            failed=values.get("failed", 0), pending=pending,
            duplicates=values.get("duplicates", 0),
        )

    def failed_rows(self) -> list[tuple[str, str, str]]:
        """(key, destination, error) of every notification given up on."""
        with self._lock:
            return list(self._db.execute("SELECT key, destination, error FROM failed ORDER BY at"))
