"""Opening the embedded SQLite files (history, watermark, notification outbox) one way.

A file in the state directory is input like any other: a local user may have crafted it. Its
schema is never trusted: a trigger or a view in it would run its own SQL inside rlmon's
statements, so a file holding one, or holding one of rlmon's names as another kind of object (a
view named ``steps``), is refused with an error naming it (:func:`check_schema`); and SQLite's
``trusted_schema`` is off, so nothing stored in the file may call a function rlmon registers.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

__all__ = ["StoreSchemaError", "check_schema", "open_database"]


class StoreSchemaError(ValueError):
    """A store file whose schema rlmon did not write (a trigger, a view, a column it does not
    know): refused, never migrated or read."""


def _created(schema: str) -> dict[str, str]:
    """name -> kind (table or index) of every object ``schema`` creates."""
    return {name.lower(): kind.lower() for kind, name in re.findall(
        r"CREATE\s+(TABLE|INDEX)\s+IF\s+NOT\s+EXISTS\s+(\w+)", schema, re.IGNORECASE)}


def check_schema(db: sqlite3.Connection, schema: str, source: str) -> None:
    """Raise :class:`StoreSchemaError` when the file holds a trigger or a view, or an object
    named as one of ``schema``'s but of another kind. Tables and indexes it does not name are
    left alone (a newer rlmon's); their names never reach SQL text."""
    wanted = _created(schema)
    for kind, name in db.execute("SELECT type, name FROM sqlite_master"):
        if kind in ("trigger", "view"):
            raise StoreSchemaError(f"{source}: holds a {kind} {name!r}, which rlmon never "
                                   "writes (a crafted file?); refusing to open it")
        expected = wanted.get(str(name).lower())
        if expected is not None and expected != kind:
            raise StoreSchemaError(f"{source}: {name!r} is a {kind}, rlmon writes a {expected}; "
                                   "refusing to open it")


def open_database(path: str | Path, schema: str) -> sqlite3.Connection:
    """A connection shared by the owner's threads (the owner holds a lock), in autocommit mode.

    A file database runs in WAL mode with ``synchronous=NORMAL``: a committed transaction
    survives a process crash, and readers do not block the writer.
    """
    name = str(path)
    if name != ":memory:":
        Path(name).parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(name, check_same_thread=False, isolation_level=None, timeout=30.0)
    try:
        db.execute("PRAGMA trusted_schema=OFF")
        check_schema(db, schema, name)
    except BaseException:
        db.close()
        raise
    if name != ":memory:":
        db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.executescript(schema)
    return db
