"""The history store a read-only command opens: where it is, from the same flags everywhere."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["add_store_arguments", "history_path", "missing_run"]

_RUNS_LISTED = 10


def add_store_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--state-dir", default=None,
                   help="the service's state directory (default: $RLMON_STATE_DIR, else the "
                   "embedded service's, $XDG_STATE_HOME/rlmon/<namespace>)")
    p.add_argument("--namespace", default="rlmon", help="namespace of the embedded service")


def missing_run(db: Path, run: str, command: str) -> bool:
    """Whether the store holds no step of ``run`` (a typo, or a run retention dropped), said on
    stderr with the runs it does hold, so an empty answer is never mistaken for a quiet run."""
    from rlmon.service.storage.history import HistoryStore

    store = HistoryStore(db)
    try:
        runs = store.runs()
    finally:
        store.close()
    if run in runs:
        return False
    listed = ", ".join(runs[:_RUNS_LISTED]) + (", ..." if len(runs) > _RUNS_LISTED else "")
    print(f"rlmon {command}: no run {run!r} in {db}"
          + (f" (its runs, latest first: {listed})" if runs else " (it holds no run)"),
          file=sys.stderr)
    return True


def history_path(args: argparse.Namespace, command: str) -> Path | None:
    """The history store's file, or None (said on stderr) when there is none."""
    from rlmon.actors.runtime import RuntimeOptions  # imports no Ray

    state = Path(RuntimeOptions(state_dir=args.state_dir).resolved_state_dir(args.namespace))
    db = state / "history.sqlite"
    if not db.exists():
        print(f"rlmon {command}: no history store at {db}", file=sys.stderr)
        return None
    from rlmon.service.storage.history import HistoryStore
    from rlmon.service.storage.sqlite_db import StoreSchemaError

    try:  # a file whose schema rlmon did not write is refused before any command reads it
        HistoryStore(db).close()
    except StoreSchemaError as exc:
        print(f"rlmon {command}: {exc}", file=sys.stderr)
        return None
    return db
