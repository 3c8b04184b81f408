"""Opening the embedded SQLite files (history, watermark, notification outbox) one way."""

from __future__ import annotations

import sqlite3
from pathlib import Path

__all__ = ["open_database"]


def open_database(path: str | Path, schema: str) -> sqlite3.Connection:
    """A connection shared by the owner's threads (the owner holds a lock), in autocommit mode.

    A file database runs in WAL mode with ``synchronous=NORMAL``: a committed transaction
    survives a process crash, and readers do not block the writer.
    """
    name = str(path)
    if name != ":memory:":
        Path(name).parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(name, check_same_thread=False, isolation_level=None, timeout=30.0)
    if name != ":memory:":
        db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.executescript(schema)
    return db
