"""The history store: every finalized step and alert event in embedded SQLite.

It backs replays, reports and plots after (or during) a run; the live exporter keeps only the
latest step per (run, role), so memory stays bounded by open steps while history goes to disk.
Writing a step twice (a redelivery after an aggregator restart) keeps one row. The alert engine's
state per (run, role, alert) is saved with the steps that produced it (one transaction), so a
restarted service resumes every state machine exactly where it stopped (an early-warning rule's
trailing window and CUSUM score included).

The notifications a step's transitions owe are committed in that same transaction (``outbound``)
and leave only once the outbox holds them (:meth:`HistoryStore.handed_over`): a crash between the
two stores, and the restarted service hands them over again (the outbox ignores a key it has), so
a transition is never stored without its notification.

Retention (:meth:`HistoryStore.prune`) keeps the newest steps of each (run, role) and drops runs
quiet for longer than a given age, whole; freed pages are reused, so the file stops growing.

The ranks' step timelines (:mod:`rlmon.service.contract.timeline`) are kept beside their steps, one row
per step, for ``rlmon trace``; retention keeps fewer of them (they are larger than a step's line).
So are a step's worst samples (:mod:`rlmon.service.storage.stored_samples`), one row per sample metric, for
``rlmon samples``: bounded by their form's k and the caller's payload budget, and by retention.
So are each step's per-rank extremes (the lowest and highest rank's own value of every metric
two ranks or more reported: the page's band), one packed row per step
(:mod:`rlmon.service.storage.extremes_rows`), pruned with their steps.
"""

from __future__ import annotations

import json
import logging
import re
import sqlite3
import threading
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rlmon.service.alerting.alert_types import AlertEvent, AlertState
from rlmon.service.contract.step_record import StepRecord, json_number
from rlmon.service.contract.stop_decision import StopDecision
from rlmon.service.contract.timeline import RankTimeline
from rlmon.service.metrics.nonfinite import NONFINITE_VALUES, nonfinite_name
from rlmon.service.metrics.ranked_forms import Sample
from rlmon.service.storage import curve_rows, extremes_rows
from rlmon.service.storage.sqlite_db import StoreSchemaError, check_schema, open_database
from rlmon.service.storage.stored_samples import (
    StepSamples,
    bound_payloads,
    items_from_json,
    items_to_json,
)

__all__ = ["HistoryStore", "Pruned", "StepTimelines", "check_history_schema"]

_log = logging.getLogger("rlmon.history")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS steps (
    run TEXT NOT NULL, role TEXT NOT NULL, step INTEGER NOT NULL, complete INTEGER NOT NULL,
    ranks_expected INTEGER NOT NULL, ranks_reporting INTEGER NOT NULL, finalized_at REAL,
    line TEXT NOT NULL, attempt INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (run, role, attempt, step));
CREATE TABLE IF NOT EXISTS alerts (
    id INTEGER PRIMARY KEY AUTOINCREMENT, run TEXT NOT NULL, role TEXT NOT NULL,
    step INTEGER NOT NULL, alert TEXT NOT NULL, severity TEXT NOT NULL, state TEXT NOT NULL,
    metric TEXT NOT NULL, value REAL, attempt INTEGER NOT NULL DEFAULT 0,
    UNIQUE (run, role, attempt, step, alert, state));
CREATE TABLE IF NOT EXISTS alert_state (
    run TEXT NOT NULL, role TEXT NOT NULL, alert TEXT NOT NULL, true_steps INTEGER NOT NULL,
    false_steps INTEGER NOT NULL, firing INTEGER NOT NULL, since_step INTEGER,
    history TEXT NOT NULL, metric TEXT NOT NULL DEFAULT '', score REAL NOT NULL DEFAULT 0,
    onset REAL, gpus REAL NOT NULL DEFAULT 0, severity TEXT NOT NULL DEFAULT '',
    reference TEXT, sent TEXT NOT NULL DEFAULT '[]', held INTEGER NOT NULL DEFAULT 0,
    claims TEXT, PRIMARY KEY (run, role, alert));
CREATE TABLE IF NOT EXISTS stream_state (
    run TEXT NOT NULL, role TEXT NOT NULL, last_step INTEGER NOT NULL, PRIMARY KEY (run, role));
CREATE TABLE IF NOT EXISTS outbound (
    id INTEGER PRIMARY KEY AUTOINCREMENT, finalized_at REAL, events TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS timelines (
    run TEXT NOT NULL, role TEXT NOT NULL, attempt INTEGER NOT NULL, step INTEGER NOT NULL,
    data TEXT NOT NULL, PRIMARY KEY (run, role, attempt, step));
CREATE TABLE IF NOT EXISTS samples (
    run TEXT NOT NULL, role TEXT NOT NULL, attempt INTEGER NOT NULL, step INTEGER NOT NULL,
    metric TEXT NOT NULL, data TEXT NOT NULL, PRIMARY KEY (run, role, attempt, step, metric));
CREATE TABLE IF NOT EXISTS stops (
    run TEXT NOT NULL PRIMARY KEY, decision TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS curve_rows (
    run TEXT NOT NULL, role TEXT NOT NULL, attempt INTEGER NOT NULL, step INTEGER NOT NULL,
    vals BLOB NOT NULL, PRIMARY KEY (run, role, attempt, step)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS rank_extremes (
    run TEXT NOT NULL, role TEXT NOT NULL, attempt INTEGER NOT NULL, step INTEGER NOT NULL,
    layout INTEGER NOT NULL, vals BLOB NOT NULL,
    PRIMARY KEY (run, role, attempt, step)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS extremes_layout (id INTEGER PRIMARY KEY, names TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS curve_layout (position INTEGER PRIMARY KEY, metric TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS liveness (
    run TEXT NOT NULL, role TEXT NOT NULL, state TEXT NOT NULL, since REAL NOT NULL,
    last_step INTEGER, last_step_at REAL, detail TEXT NOT NULL, PRIMARY KEY (run, role));
CREATE TABLE IF NOT EXISTS run_info (
    run TEXT PRIMARY KEY, labels TEXT NOT NULL, said_at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS steps_run_time ON steps (run, finalized_at);
CREATE INDEX IF NOT EXISTS alerts_stream ON alerts (run, role, attempt, step);
CREATE INDEX IF NOT EXISTS rank_extremes_layout ON rank_extremes (layout);
"""

Outbound = tuple[float | None, Sequence[AlertEvent]]  # (the step's finalization, its transitions)


@dataclass(frozen=True, slots=True)
class Pruned:
    """What one retention pass removed."""

    steps: int = 0
    alerts: int = 0
    runs: tuple[str, ...] = ()
    timelines: int = 0
    samples: int = 0  # (step, sample metric) rows


@dataclass(frozen=True, slots=True)
class StepTimelines:
    """The stored timelines of one step: every rank's, and how many spans or ranks were cut."""

    run: str
    role: str
    attempt: int
    step: int
    ranks: tuple[RankTimeline, ...]
    cut: int = 0


def _stream_filter(run: str | None, role: str | None) -> tuple[str, list[str]]:
    if run is None:
        return "", []
    if role is None:
        return " WHERE run = ?", [run]
    return " WHERE run = ? AND role = ?", [run, role]


def _metrics(line: dict[str, Any]) -> dict[str, float]:
    values = {k: float(v) for k, v in line["metrics"].items() if v is not None}
    for name, text in line.get("nonfinite", {}).items():
        values[name] = NONFINITE_VALUES[text]
    return values


_COST_COLUMNS = (("onset", "REAL"), ("gpus", "REAL"), ("gpu_hours", "REAL"), ("money", "REAL"),
                 ("cost_note", "TEXT NOT NULL DEFAULT ''"))


# a resolve that is not a recovery: the run ended with the alert firing
# (AlertEvent.ended_with_run), or an early warning handed over to its level rule (handed_to)
_ENDING_COLUMNS = (("ended_with_run", "INTEGER NOT NULL DEFAULT 0"),
                   ("handed_to", "TEXT NOT NULL DEFAULT ''"))
# SQLite keeps a NaN as NULL (and the value column keeps no Inf either): which non-finite value
# the alert's metric had ("NaN", "Infinity", "-Infinity"; '' where finite or unknown)
_VALUE_COLUMNS = (("nonfinite", "TEXT NOT NULL DEFAULT ''"),)
_STATE_COST_COLUMNS = (("onset", "REAL"), ("gpus", "REAL NOT NULL DEFAULT 0"))
# what the engine's notification policy keeps (issue 30): the severity now (an escalated
# warning), a baseline rule's pre-onset level, the last hour's notifications
_STATE_POLICY_COLUMNS = (("severity", "TEXT NOT NULL DEFAULT ''"), ("reference", "TEXT"),
                         ("sent", "TEXT NOT NULL DEFAULT '[]'"),
                         ("held", "INTEGER NOT NULL DEFAULT 0"),
                         ("claims", "TEXT"))  # issue 39: AlertState.claims_json
_SCORE_COLUMNS = (("score", "REAL NOT NULL DEFAULT 0"),)
# the columns the migrations add to a store written before them, by table
_ADDED_COLUMNS = (("alerts", _COST_COLUMNS), ("alerts", _ENDING_COLUMNS), ("alerts", _VALUE_COLUMNS),
                  ("alert_state", _STATE_COST_COLUMNS), ("alert_state", _STATE_POLICY_COLUMNS),
                  ("alert_state", _SCORE_COLUMNS))


def _code_columns() -> dict[str, frozenset[str]]:
    """Every column of the code's own schema, by table (``_SCHEMA``'s and those the migrations
    add): the only identifiers a migration puts into SQL text. A store file is input; the names
    it lists are checked against these, never pasted as they come."""
    db = sqlite3.connect(":memory:")
    try:
        db.executescript(_SCHEMA)
        tables = [t for (t,) in db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")]
        found = {t: {c for (c,) in db.execute("SELECT name FROM pragma_table_info(?)", (t,))}
                 for t in tables}
    finally:
        db.close()
    for table, added in _ADDED_COLUMNS:
        found[table] |= {name for name, _kind in added}
    return {t: frozenset(c) for t, c in found.items()}


_CODE_COLUMNS = _code_columns()
_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]*\Z")


def _quoted(table: str, column: str | None = None) -> str:
    """``table`` (or its ``column``) as a quoted SQL identifier, after checking it is one of
    the code's own; anything else is a :class:`StoreSchemaError` naming it."""
    name = table if column is None else column
    known = _CODE_COLUMNS.get(table)
    if known is None or (column is not None and column not in known) \
            or not _IDENTIFIER.match(name):
        what = f"table {table!r}" if column is None else f"table {table} has a column {column[:80]!r}"
        raise StoreSchemaError(f"{what}, which rlmon never writes (a crafted file?); refusing to "
                               "migrate it")
    return f'"{name}"'


def _columns(db: sqlite3.Connection, table: str) -> list[str]:
    """The columns ``table`` has in the file, in order (its name a bound parameter)."""
    return [str(c) for (c,) in db.execute("SELECT name FROM pragma_table_info(?)", (table,))]


def check_history_schema(db: sqlite3.Connection, source: str) -> None:
    """A reader's own connection to a history store file (the page's, ``rlmon diagnose``'s):
    refused when the file holds SQL of its own (:func:`~rlmon.service.storage.sqlite_db.
    check_schema`); nothing stored in it may call a function the connection registers."""
    db.execute("PRAGMA trusted_schema=OFF")
    check_schema(db, _SCHEMA, source)


def _add_attempts(db: sqlite3.Connection) -> None:
    """Rebuild a store written before runs had attempts: its rows become attempt 0."""
    for table in ("steps", "alerts"):
        columns = _columns(db, table)
        if "attempt" in columns:
            continue
        create = _SCHEMA.split("CREATE TABLE IF NOT EXISTS ")[1 if table == "steps" else 2]
        kept = ", ".join(_quoted(table, c) for c in columns)  # the file's names: checked
        name, old = _quoted(table), _quoted(table)[:-1] + '_old"'
        db.execute("BEGIN")
        try:
            db.execute(f"ALTER TABLE {name} RENAME TO {old}")
            db.execute("CREATE TABLE " + create.strip().rstrip(";"))
            db.execute(f"INSERT INTO {name} ({kept}) SELECT {kept} FROM {old}")
            db.execute(f"DROP TABLE {old}")
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise


def _add_columns(db: sqlite3.Connection, table: str,
                 wanted: Sequence[tuple[str, str]]) -> None:
    """Add the code's ``wanted`` columns (name, declaration) that ``table`` lacks."""
    columns = set(_columns(db, table))
    for name, kind in wanted:
        if name not in columns:
            db.execute(f"ALTER TABLE {_quoted(table)} ADD COLUMN {_quoted(table, name)} {kind}")


def _add_later_columns(db: sqlite3.Connection) -> None:
    """Every column of :data:`_ADDED_COLUMNS` that a store written before it lacks. A store
    written before alerts carried their cost: they start empty (cost unknown), and the alert
    states' onset and GPUs too. Before the notification policy: a firing alert keeps its rule's
    severity, has no pre-onset level (its CUSUM alone judges it, as before) and no
    notifications counted. Before early-warning rules: their CUSUM score starts at 0. Before
    run-end closings were marked: its resolves read as resolved."""
    for table, wanted in _ADDED_COLUMNS:
        _add_columns(db, table, wanted)


def _fill_curve_rows(db: sqlite3.Connection) -> int:
    """Pack the key curves of the steps that have no curve row (a store written before they
    were kept, or with another layout: its rows are packed again); returns how many."""
    layout = [m for (m,) in db.execute("SELECT metric FROM curve_layout ORDER BY position")]
    (steps,), = db.execute("SELECT COUNT(*) FROM steps")
    (rows,), = db.execute("SELECT COUNT(*) FROM curve_rows")
    if layout == list(curve_rows.CURVE_METRICS) and steps == rows:
        return 0
    db.create_function("rlmon_pack_curves", 2 * len(curve_rows.CURVE_METRICS),
                       curve_rows.pack_stored, deterministic=True)
    paths = [m.replace('"', "") for m in curve_rows.CURVE_METRICS]
    columns = ", ".join([f"json_extract(line, '$.metrics.\"{m}\"')" for m in paths]
                        + [f"json_extract(line, '$.nonfinite.\"{m}\"')" for m in paths])
    db.execute("BEGIN IMMEDIATE")
    try:
        if layout != list(curve_rows.CURVE_METRICS):
            db.execute("DELETE FROM curve_rows")
            db.execute("DELETE FROM curve_layout")
            db.executemany("INSERT INTO curve_layout VALUES (?, ?)",
                           list(enumerate(curve_rows.CURVE_METRICS)))
        added = db.execute(
            f"INSERT OR IGNORE INTO curve_rows SELECT run, role, attempt, step, "
            f"rlmon_pack_curves({columns}) FROM steps s WHERE NOT EXISTS (SELECT 1 FROM "
            "curve_rows c WHERE c.run = s.run AND c.role = s.role AND c.attempt = s.attempt AND "
            "c.step = s.step)").rowcount
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    return int(added)


class HistoryStore:
    """Append-only store of step lines (the replay contract's JSON) and alert transitions."""

    def __init__(self, path: str | Path = ":memory:", *, sample_payload_bytes: int = 32_768,
                 read_only: bool = False) -> None:
        """``sample_payload_bytes``: payload text kept per sample metric and step (the rest is
        cut, counted in ``sample_payloads_cut``). ``read_only``: a reader's own connection to
        a store another connection writes (the web page's: in WAL mode it never blocks the
        writer); the file must exist."""
        self.sample_payload_bytes = sample_payload_bytes
        self.sample_payloads_cut = 0
        self._lock = threading.Lock()
        self.closed = False
        if read_only:
            self._db = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True,
                                       check_same_thread=False, isolation_level=None)
            check_history_schema(self._db, str(path))
            return
        self._db = open_database(path, _SCHEMA)
        try:
            _add_attempts(self._db)
            _add_later_columns(self._db)
        except StoreSchemaError as exc:
            self._db.close()
            raise StoreSchemaError(f"{path}: {exc}") from None
        packed = _fill_curve_rows(self._db)
        if packed:
            _log.info("rlmon: history store: packed the key curves of %d stored steps (once: "
                      "they were written before the store kept them)", packed)

    def read(self, query: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """The rows of one read query (for readers with their own questions, such as the web
        page's curves)."""
        with self._lock:
            return self._db.execute(query, args).fetchall()

    def add(
        self, records: Sequence[StepRecord], events: Iterable[AlertEvent] = (),
        *, states: Mapping[tuple[str, str, str], AlertState] | None = None,
        last_steps: Mapping[tuple[str, str], int] | None = None,
        outbound: Sequence[Outbound] = (),
        stops: Sequence[StopDecision] = (),
    ) -> int:
        """Store steps, alert events, the engine state after them, the notifications they owe
        (``outbound``) and the stop decisions they took or renewed, in one transaction; returns
        how many steps were new (not redeliveries)."""
        with self._lock:
            self._db.execute("BEGIN")
            before = self._db.total_changes
            self._db.executemany(
                "INSERT OR IGNORE INTO steps VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (r.run, r.role, r.step, int(r.complete), r.ranks_expected, r.ranks_reporting,
                     r.finalized_at, json.dumps(r.to_json(), allow_nan=False), r.attempt)
                    for r in records
                ],
            )
            new = self._db.total_changes - before
            self._db.executemany(
                "INSERT OR IGNORE INTO curve_rows VALUES (?, ?, ?, ?, ?)",
                [(r.run, r.role, r.attempt, r.step, curve_rows.pack(r.metrics)) for r in records])
            self._db.executemany(
                "INSERT OR IGNORE INTO timelines VALUES (?, ?, ?, ?, ?)",
                [
                    (r.run, r.role, r.attempt, r.step, json.dumps(
                        {"cut": r.timelines_cut, "ranks": [t.to_json() for t in r.timelines]},
                        allow_nan=False, separators=(",", ":")))
                    for r in records if r.timelines or r.timelines_cut
                ],
            )
            extremes, layouts = [], {}
            for r in records:
                if r.rank_extremes:
                    names, blob = extremes_rows.pack(r.rank_extremes)
                    if names not in layouts:
                        layouts[names] = extremes_rows.layout_row(names)
                    extremes.append((r.run, r.role, r.attempt, r.step, layouts[names][0], blob))
            self._db.executemany("INSERT OR IGNORE INTO extremes_layout VALUES (?, ?)",
                                 list(layouts.values()))
            self._db.executemany("INSERT OR IGNORE INTO rank_extremes VALUES (?, ?, ?, ?, ?, ?)",
                                 extremes)
            self._db.executemany(
                "INSERT OR IGNORE INTO samples VALUES (?, ?, ?, ?, ?, ?)",
                [(r.run, r.role, r.attempt, r.step, metric, self._samples_row(items))
                 for r in records for metric, items in r.samples.items()],
            )
            self._db.executemany(
                "INSERT OR IGNORE INTO alerts (run, role, step, alert, severity, state, metric, "
                "value, attempt, onset, gpus, gpu_hours, money, cost_note, ended_with_run, "
                "handed_to, nonfinite) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (e.run, e.role, e.step, e.alert, e.severity, e.state, e.metric,
                     json_number(e.value), e.attempt, e.onset, e.gpus if e.cost_note else None,
                     e.gpu_hours, e.money, e.cost_note, int(e.ended_with_run), e.handed_to,
                     nonfinite_name(e.value))
                    for e in events if not e.repeat  # a re-send is not a transition
                ],
            )
            self._db.executemany(
                "INSERT OR REPLACE INTO alert_state (run, role, alert, true_steps, false_steps, "
                "firing, since_step, history, metric, score, onset, gpus, severity, reference, "
                "sent, held, claims) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (run, role, alert, st.true_steps, st.false_steps, int(st.firing),
                     st.since_step, json.dumps([float(v) for v in st.history]),
                     str(getattr(st, "metric", "")), float(st.score), st.onset, float(st.gpus),
                     st.severity, None if st.reference is None else json.dumps(st.reference),
                     json.dumps(list(st.sent)), int(st.held), st.claims_json())
                    for (run, role, alert), st in (states or {}).items()
                ],
            )
            self._db.executemany(
                "INSERT OR REPLACE INTO stream_state VALUES (?, ?, ?)",
                [(run, role, step) for (run, role), step in (last_steps or {}).items()],
            )
            self._db.executemany(
                "INSERT INTO outbound (finalized_at, events) VALUES (?, ?)",
                [(at, json.dumps([asdict(e) for e in batch])) for at, batch in outbound if batch],
            )
            self._db.executemany(
                "INSERT OR REPLACE INTO stops VALUES (?, ?)",
                [(d.run, json.dumps(d.to_json(), allow_nan=False)) for d in stops],
            )
            self._db.execute("COMMIT")
        return new

    def _samples_row(self, items: Sequence[Sample]) -> str:
        kept, cut = bound_payloads(items, self.sample_payload_bytes)
        self.sample_payloads_cut += cut
        return json.dumps({"items": items_to_json(kept), "cut": cut}, allow_nan=False,
                          separators=(",", ":"))

    def outbound(self) -> list[tuple[int, float | None, list[AlertEvent]]]:
        """(id, finalized_at, transitions) of the notifications not yet handed to the outbox."""
        with self._lock:
            rows = self._db.execute(
                "SELECT id, finalized_at, events FROM outbound ORDER BY id").fetchall()
        return [(int(i), at, [AlertEvent(**e) for e in json.loads(text)]) for i, at, text in rows]

    def handed_over(self, ids: Iterable[int]) -> None:
        """The outbox holds these notifications now."""
        with self._lock:
            self._db.executemany("DELETE FROM outbound WHERE id = ?", [(i,) for i in ids])

    def alert_states(
        self, run: str | None = None, role: str | None = None,
    ) -> dict[tuple[str, str, str], AlertState]:
        """The saved alert state machines (see :class:`~rlmon.service.alerting.engine.AlertEngine`), of
        every stream or of one run or (run, role)."""
        where, args = _stream_filter(run, role)
        with self._lock:
            have = _columns(self._db, "alert_state")
            cost = ", ".join(n if n in have else "NULL" for n, _ in
                             (*_STATE_COST_COLUMNS, *_STATE_POLICY_COLUMNS))
            rows = self._db.execute(
                "SELECT run, role, alert, true_steps, false_steps, firing, since_step, history, "
                f"metric, score, {cost} FROM alert_state" + where, args).fetchall()
        out = {}
        for (run, role, alert, t, f, firing, since, hist, metric, score, onset, gpus, severity,
             ref, sent, held, claims) in rows:
            reference = json.loads(ref) if ref else None
            state = AlertState(true_steps=int(t), false_steps=int(f), firing=bool(firing),
                               since_step=since,
                               history=deque(float(v) for v in json.loads(hist)),
                               score=float(score), onset=onset, gpus=float(gpus or 0.0),
                               severity=severity or "",
                               reference=(float(reference[0]), float(reference[1]))
                               if reference else None,
                               sent=deque(float(v) for v in json.loads(sent or "[]")),
                               held=bool(held))
            if hasattr(state, "metric"):
                state.metric = metric
            state.load_claims(claims)
            out[(run, role, alert)] = state
        return out

    def last_steps(self, run: str | None = None, role: str | None = None,
                   ) -> dict[tuple[str, str], int]:
        """The last evaluated step of every (run, role) (or of one run or stream)."""
        where, args = _stream_filter(run, role)
        with self._lock:
            rows = self._db.execute("SELECT run, role, last_step FROM stream_state" + where,
                                    args).fetchall()
        return {(run, role): int(step) for run, role, step in rows}

    def latest_attempts(self, run: str | None = None, role: str | None = None,
                        ) -> dict[tuple[str, str], int]:
        """The latest attempt (rerun) stored for every (run, role) that has one."""
        where, args = _stream_filter(run, role)
        with self._lock:
            rows = self._db.execute("SELECT run, role, MAX(attempt) FROM steps" + where
                                    + " GROUP BY run, role HAVING MAX(attempt) > 0",
                                    args).fetchall()
        return {(run, role): int(attempt) for run, role, attempt in rows}

    def has_step(self, run: str, role: str, step: int, attempt: int = 0) -> bool:
        with self._lock:
            row = self._db.execute(
                "SELECT 1 FROM steps WHERE run = ? AND role = ? AND attempt = ? AND step = ?",
                (run, role, attempt, step),
            ).fetchone()
        return row is not None

    def runs(self) -> list[str]:
        """The runs the store holds steps of, the latest to finalize a step first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT run FROM steps GROUP BY run ORDER BY MAX(finalized_at) DESC").fetchall()
        return [run for (run,) in rows]

    def steps(self, run: str | None = None, role: str | None = None) -> list[dict[str, Any]]:
        """Step lines (docs/design.md, "The replay contract") in (run, role, step) order."""
        query, args = "SELECT line FROM steps", []
        clauses = []
        if run is not None:
            clauses.append("run = ?")
            args.append(run)
        if role is not None:
            clauses.append("role = ?")
            args.append(role)
        if clauses:
            query += " WHERE " + " AND ".join(clauses)
        with self._lock:
            rows = self._db.execute(query + " ORDER BY run, role, attempt, step", args).fetchall()
        return [json.loads(line) for (line,) in rows]

    def series(self, run: str, role: str, metric: str) -> list[tuple[int, float]]:
        """(step, value) of one metric over a run, for plots."""
        out = []
        for line in self.steps(run, role):
            value = _metrics(line).get(metric)
            if value is not None:
                out.append((int(line["step"]), value))
        return out

    def curve_values(self, run: str, role: str, attempt: int, after: int | None = None,
                     ) -> list[tuple[int, bytes]] | None:
        """(step, packed key curves) of a stream's steps after ``after``, in step order
        (:mod:`rlmon.service.storage.curve_rows`); None where the store does not hold them for
        every such step (a store written before they were kept, opened read-only)."""
        where = "run = ? AND role = ? AND attempt = ?" + (" AND step > ?" if after is not None
                                                          else "")
        args = (run, role, attempt, *([after] if after is not None else []))
        with self._lock:
            try:
                layout = [m for (m,) in self._db.execute(
                    "SELECT metric FROM curve_layout ORDER BY position")]
            except sqlite3.OperationalError:  # no such table
                return None
            if layout != list(curve_rows.CURVE_METRICS):
                return None
            self._db.execute("BEGIN")  # one snapshot: the rows and the count agree
            try:
                rows = self._db.execute(
                    f"SELECT step, vals FROM curve_rows WHERE {where} ORDER BY step",
                    args).fetchall()
                (steps,), = self._db.execute(f"SELECT COUNT(*) FROM steps WHERE {where}", args)
            finally:
                self._db.execute("COMMIT")
        return rows if len(rows) == steps else None

    def rank_extremes(self, run: str, role: str, attempt: int, steps: Sequence[int],
                      metrics: Iterable[str]) -> dict[str, extremes_rows.Extremes]:
        """Per metric of ``metrics``, the lowest and highest rank's own value at each of
        ``steps`` that kept them, as arrays (steps, lows, highs) in step order (NaN and Inf as
        they are); a store written before they were kept has none."""
        wanted = set(metrics)
        out = extremes_rows.unpack({}, (), wanted)  # none
        if not steps or not wanted:
            return out
        with self._lock:
            try:
                rows = self._db.execute(
                    "SELECT step, layout, vals FROM rank_extremes WHERE run = ? AND role = ? AND "
                    "attempt = ? AND step IN (SELECT value FROM json_each(?))",
                    (run, role, attempt, json.dumps(list(steps)))).fetchall()
                layouts = {int(i): tuple(json.loads(names)) for i, names in self._db.execute(
                    "SELECT id, names FROM extremes_layout WHERE id IN (SELECT value FROM "
                    "json_each(?))", (json.dumps(sorted({r[1] for r in rows})),))}
            except sqlite3.OperationalError:  # no such table: an older store, read-only
                return out
        return extremes_rows.unpack(layouts, rows, wanted)

    def timelines(self, run: str, role: str | None = None, first: int = 0,
                  last: int | None = None, *, every_attempt: bool = False,
                  ) -> list[StepTimelines]:
        """The stored timelines of a run's steps ``first..last`` (of one role, or every role),
        of each role's latest attempt (or of every attempt), in (role, attempt, step) order."""
        query = ("SELECT role, attempt, step, data FROM timelines t WHERE run = ? AND step >= ?"
                 + ("" if every_attempt else
                    " AND attempt = (SELECT MAX(attempt) FROM timelines u WHERE u.run = t.run "
                    "AND u.role = t.role)"))
        args: list[Any] = [run, first]
        if last is not None:
            query += " AND step <= ?"
            args.append(last)
        if role is not None:
            query += " AND role = ?"
            args.append(role)
        with self._lock:
            rows = self._db.execute(query + " ORDER BY role, attempt, step", args).fetchall()
        out = []
        for role_, attempt, step, text in rows:
            data = json.loads(text)
            out.append(StepTimelines(run, role_, int(attempt), int(step), tuple(
                RankTimeline.from_json(t) for t in data["ranks"]), int(data["cut"])))
        return out

    def samples(self, run: str, role: str | None = None, step: int | None = None,
                metric: str | None = None, attempt: int | None = None) -> list[StepSamples]:
        """The stored samples of a run's latest attempt per role (or of ``attempt``), at
        ``step`` (default: each role's latest step that has samples), of one metric or all, in
        (role, metric) order."""
        latest = ("attempt = (SELECT MAX(attempt) FROM samples u WHERE u.run = t.run AND "
                  "u.role = t.role)") if attempt is None else f"attempt = {int(attempt)}"
        at = "step = ?" if step is not None else (
            "step = (SELECT MAX(step) FROM samples v WHERE v.run = t.run AND v.role = t.role "
            "AND v.attempt = t.attempt" + (" AND v.metric = t.metric" if metric else "") + ")")
        query = f"SELECT role, attempt, step, metric, data FROM samples t WHERE run = ? AND " \
                f"{latest} AND {at}"
        args: list[Any] = [run] + ([step] if step is not None else [])
        if role is not None:
            query += " AND role = ?"
            args.append(role)
        if metric is not None:
            query += " AND metric = ?"
            args.append(metric)
        with self._lock:
            rows = self._db.execute(query + " ORDER BY role, metric", args).fetchall()
        out = []
        for role_, attempt, step_, name, text in rows:
            data = json.loads(text)
            out.append(StepSamples(run, role_, int(attempt), int(step_), name,
                                   items_from_json(data["items"]), int(data.get("cut", 0))))
        return out

    def alerts(self, run: str | None = None, *, cost: bool = False) -> list[dict[str, Any]]:
        """Alert lines (the replay contract's) in the order they happened; with ``cost``, each
        also says its attempt, what its condition had cost (``onset``, ``gpus``,
        ``gpu_hours``, ``money``, ``cost_note``; None where unknown, as in a store written
        before alerts carried their cost and opened read-only) and whether a resolve only says
        the run ended with it firing (``ended_with_run``) or that its level rule took over
        (``handed_to``: that rule's name), and which non-finite value a null ``value`` stands
        for (``nonfinite``: "NaN", "Infinity", "-Infinity", or '')."""
        keys: tuple[str, ...] = ("run", "role", "step", "alert", "severity", "state", "metric",
                                 "value")
        if cost:
            keys += ("attempt", *(name for name, _ in
                                  _COST_COLUMNS + _ENDING_COLUMNS + _VALUE_COLUMNS))
        args: list[Any] = []
        where = ""
        if run is not None:
            where = " WHERE run = ?"
            args.append(run)
        with self._lock:
            have = _columns(self._db, "alerts")
            columns = ", ".join(k if k in have else "NULL" for k in keys)
            rows = self._db.execute(f"SELECT {columns} FROM alerts{where} ORDER BY id",
                                    args).fetchall()
        return [{"type": "alert", **dict(zip(keys, row, strict=True))} for row in rows]

    def stops(self, run: str | None = None, limit: int | None = None) -> list[StopDecision]:
        """The stop decisions (of every run, or of one), the most recently taken first."""
        where, args = _stream_filter(run, None)
        query = "SELECT decision FROM stops" + where
        with self._lock:
            rows = self._db.execute(query, args).fetchall()
        found = sorted((StopDecision.from_json(json.loads(text)) for (text,) in rows),
                       key=lambda d: d.at, reverse=True)
        return found[:limit] if limit is not None else found

    def set_liveness(self, rows: Sequence[tuple[str, str, str, float, int | None, float | None,
                                                str]]) -> None:
        """Each (run, role)'s liveness state as it changed: (run, role, state, since (unix),
        last step, its unix time, where the ranks are) (docs/liveness.md)."""
        with self._lock:
            self._db.executemany("INSERT OR REPLACE INTO liveness VALUES (?, ?, ?, ?, ?, ?, ?)",
                                 list(rows))

    def set_run_info(self, run: str, labels: Mapping[str, str], said_at: float) -> None:
        """What a run's integration said of it (its settings, its tags), as its labels: kept
        as long as the run's steps, so the run page shows them after the run left the service's
        memory or the service restarted."""
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO run_info VALUES (?, ?, ?)",
                             (run, json.dumps(dict(labels)), said_at))

    def run_infos(self) -> dict[str, dict[str, str]]:
        """Each run's labels as last said (:meth:`set_run_info`)."""
        with self._lock:
            rows = self._db.execute("SELECT run, labels FROM run_info").fetchall()
        return {run: {str(k): str(v) for k, v in json.loads(text).items()}
                for run, text in rows}

    def liveness(self, run: str | None = None) -> list[dict[str, Any]]:
        """The latest liveness state of each (run, role), in (run, role) order."""
        where, args = _stream_filter(run, None)
        with self._lock:
            rows = self._db.execute(
                "SELECT run, role, state, since, last_step, last_step_at, detail FROM liveness"
                + where + " ORDER BY run, role", args).fetchall()
        keys = ("run", "role", "state", "since", "last_step", "last_step_at", "detail")
        return [dict(zip(keys, row, strict=True)) for row in rows]

    def firing_alerts(self, run: str | None = None) -> list[dict[str, Any]]:
        """The alerts firing now, each with the transition that made it fire (step, value, the
        step's finalization time), in (run, role, alert) order."""
        where = " AND s.run = ?" if run is not None else ""
        nonfinite = "a.nonfinite" if self.has_column("alerts", "nonfinite") else "''"
        query = (
            "SELECT s.run, s.role, s.alert, s.since_step, a.severity, a.metric, a.value, "
            "a.attempt, t.finalized_at, " + nonfinite + " FROM alert_state s "
            "LEFT JOIN alerts a ON a.id = (SELECT MAX(id) FROM alerts b WHERE b.run = s.run "
            "AND b.role = s.role AND b.alert = s.alert AND b.state = 'firing') "
            "LEFT JOIN steps t ON t.run = a.run AND t.role = a.role AND t.attempt = a.attempt "
            "AND t.step = a.step WHERE s.firing = 1" + where + " ORDER BY s.run, s.role, s.alert")
        with self._lock:
            rows = self._db.execute(query, [run] if run is not None else []).fetchall()
        keys = ("run", "role", "alert", "step", "severity", "metric", "value", "attempt", "time",
                "nonfinite")
        return [{"type": "alert", **dict(zip(keys, row, strict=True)), "state": "firing"}
                for row in rows]

    def has_column(self, table: str, column: str) -> bool:
        """Whether the file's ``table`` has ``column`` (a store written before it was added,
        opened read-only, does not)."""
        with self._lock:
            return column in _columns(self._db, table)

    def recent_alerts(self, run: str | None = None, limit: int = 20) -> list[dict[str, Any]]:
        """The latest ``limit`` alert transitions (firing and resolved), newest first, each with
        its step's finalization time and whether a resolve only says the run ended with it
        firing or that its level rule took over."""
        where = " WHERE a.run = ?" if run is not None else ""
        with self._lock:
            have = _columns(self._db, "alerts")  # a store written before, opened read-only
            ended = "a.ended_with_run" if "ended_with_run" in have else "0"
            handed = "a.handed_to" if "handed_to" in have else "''"
            nonfinite = "a.nonfinite" if "nonfinite" in have else "''"
            query = (
                "SELECT a.run, a.role, a.step, a.alert, a.severity, a.state, a.metric, a.value, "
                "a.attempt, t.finalized_at, " + ended + ", " + handed + ", " + nonfinite
                + " FROM alerts a "
                "LEFT JOIN steps t ON "
                "t.run = a.run AND t.role = a.role AND t.attempt = a.attempt AND t.step = a.step"
                + where + " ORDER BY a.id DESC LIMIT ?")
            rows = self._db.execute(query, [*([run] if run is not None else []), limit]).fetchall()
        keys = ("run", "role", "step", "alert", "severity", "state", "metric", "value",
                "attempt", "time", "ended_with_run", "handed_to", "nonfinite")
        return [{"type": "alert", **dict(zip(keys, row, strict=True))} for row in rows]

    def prune(self, keep_steps: int, quiet_before: float | None = None,
              keep_timelines: int | None = None, keep_samples: int | None = None) -> Pruned:
        """Keep the newest ``keep_steps`` steps (and their alerts) of each (run, role), and the
        timelines of its newest ``keep_timelines`` steps (default: as many); drop every run whose
        last step was finalized before ``quiet_before`` (unix seconds), whole."""
        keep_timelines = keep_steps if keep_timelines is None else min(keep_timelines, keep_steps)
        keep_samples = keep_steps if keep_samples is None else min(keep_samples, keep_steps)
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                runs: list[str] = []
                if quiet_before is not None:
                    runs = [r for (r,) in self._db.execute(
                        "SELECT run FROM steps GROUP BY run HAVING MAX(finalized_at) < ?",
                        (quiet_before,))]
                steps = alerts = timelines = samples = 0
                for run in runs:
                    steps += self._db.execute("DELETE FROM steps WHERE run = ?", (run,)).rowcount
                    alerts += self._db.execute("DELETE FROM alerts WHERE run = ?",
                                               (run,)).rowcount
                    timelines += self._db.execute("DELETE FROM timelines WHERE run = ?",
                                                  (run,)).rowcount
                    samples += self._db.execute("DELETE FROM samples WHERE run = ?",
                                                (run,)).rowcount
                    self._db.execute("DELETE FROM curve_rows WHERE run = ?", (run,))
                    self._db.execute("DELETE FROM rank_extremes WHERE run = ?", (run,))
                    self._db.execute("DELETE FROM alert_state WHERE run = ?", (run,))
                    self._db.execute("DELETE FROM stream_state WHERE run = ?", (run,))
                    self._db.execute("DELETE FROM stops WHERE run = ?", (run,))
                    self._db.execute("DELETE FROM run_info WHERE run = ?", (run,))
                crowded = self._db.execute(
                    "SELECT run, role FROM steps GROUP BY run, role HAVING COUNT(*) > ?",
                    (keep_steps,)).fetchall()
                for run, role in crowded:
                    # the newest step that goes: it and everything older leave
                    attempt, step = self._db.execute(
                        "SELECT attempt, step FROM steps WHERE run = ? AND role = ? "
                        "ORDER BY attempt DESC, step DESC LIMIT 1 OFFSET ?",
                        (run, role, keep_steps)).fetchone()
                    older = ("run = ? AND role = ? AND (attempt < ? OR (attempt = ? AND "
                             "step <= ?))")
                    args = (run, role, attempt, attempt, step)
                    steps += self._db.execute(f"DELETE FROM steps WHERE {older}", args).rowcount
                    alerts += self._db.execute(f"DELETE FROM alerts WHERE {older}",
                                               args).rowcount
                    self._db.execute(f"DELETE FROM curve_rows WHERE {older}", args)
                    self._db.execute(f"DELETE FROM rank_extremes WHERE {older}", args)
                crowded = self._db.execute(
                    "SELECT run, role FROM timelines GROUP BY run, role HAVING COUNT(*) > ?",
                    (keep_timelines,)).fetchall()
                for run, role in crowded:
                    attempt, step = self._db.execute(
                        "SELECT attempt, step FROM timelines WHERE run = ? AND role = ? "
                        "ORDER BY attempt DESC, step DESC LIMIT 1 OFFSET ?",
                        (run, role, keep_timelines)).fetchone()
                    timelines += self._db.execute(
                        "DELETE FROM timelines WHERE run = ? AND role = ? AND (attempt < ? OR "
                        "(attempt = ? AND step <= ?))", (run, role, attempt, attempt, step),
                    ).rowcount
                samples += self._keep_newest_samples(keep_samples)
                if steps:  # layouts no step uses any more (names come and go)
                    self._db.execute(
                        "DELETE FROM extremes_layout WHERE NOT EXISTS (SELECT 1 FROM "
                        "rank_extremes e WHERE e.layout = extremes_layout.id)")
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            # fold the write-ahead log into the file and cut it: the freed pages are reused
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return Pruned(steps, alerts, tuple(runs), timelines, samples)

    def _keep_newest_samples(self, keep: int) -> int:
        """Drop the samples of all but the newest ``keep`` steps of each (run, role)."""
        removed = 0
        crowded = self._db.execute(
            "SELECT run, role FROM samples GROUP BY run, role HAVING COUNT(DISTINCT "
            "attempt || ':' || step) > ?", (keep,)).fetchall()
        for run, role in crowded:
            attempt, step = self._db.execute(
                "SELECT DISTINCT attempt, step FROM samples WHERE run = ? AND role = ? "
                "ORDER BY attempt DESC, step DESC LIMIT 1 OFFSET ?", (run, role, keep)).fetchone()
            removed += self._db.execute(
                "DELETE FROM samples WHERE run = ? AND role = ? AND (attempt < ? OR "
                "(attempt = ? AND step <= ?))", (run, role, attempt, attempt, step)).rowcount
        return removed

    def size_bytes(self) -> int:
        """Bytes on disk (database and write-ahead log); 0 in memory."""
        with self._lock:
            name = self._db.execute("PRAGMA database_list").fetchone()[2]
        if not name:
            return 0
        return sum(p.stat().st_size for p in (Path(name), Path(name + "-wal"))
                   if p.exists())

    def close(self) -> None:
        with self._lock:
            self._db.close()
            self.closed = True
