"""``rlmon diff RUN_A RUN_B``: where two runs part ways beyond their own noise (docs/diff.md).

Each run is a log path (anything ``rlmon diagnose`` reads; ``PATH::RUN`` picks one run of a file
holding several) or the name of a run in the history store. Prints the first step where they
part ways, the metric that diverged first, every metric's verdict and the recorded settings that
differ; ``--json`` prints the same as one JSON object; ``--html FILE`` writes a page.

Exit status: 0 when compared (diverged or not), 2 when a run cannot be read or has nothing in
common with the other.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from rlmon.commands.support.history_store import add_store_arguments
from rlmon.service.json_output import dumps
from rlmon.service.terminal_text import visible_output

if TYPE_CHECKING:
    from rlmon.service.diff.runs import RunSeries

__all__ = ["register", "run_diff"]

EXIT_OK, EXIT_INPUT = 0, 2
_SEPARATOR = "::"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("diff", help="where two runs part ways beyond their own noise (logs or "
                       "stored runs)")
    p.add_argument("run_a", metavar="RUN_A", help="a log path (PATH::RUN for one run of a file "
                   "holding several) or a run name in the history store")
    p.add_argument("run_b", metavar="RUN_B", help="the run to compare it with")
    p.add_argument("--json", action="store_true", help="the comparison as one JSON object")
    p.add_argument("--html", metavar="FILE", help="also write a self-contained HTML page")
    p.add_argument("--persist", type=int, default=None,
                   help="consecutive steps a departure must hold (default 10)")
    p.add_argument("--z", type=float, default=None,
                   help="noise scales a departure must exceed (default 2.5, raised for the "
                   "number of metrics)")
    add_store_arguments(p)
    p.set_defaults(func=run_diff)


class _InputError(Exception):
    pass


def _from_path(label: str) -> RunSeries:
    from rlmon.service.diagnose.formats import read_paths
    from rlmon.service.diff.runs import from_logged

    path, _, wanted = label.partition(_SEPARATOR)
    runs, problems = read_paths([path])
    for problem in problems:
        print(f"rlmon diff: {problem.path}: {problem.message}", file=sys.stderr)
    if wanted:
        runs = [r for r in runs if r.name == wanted]
    if not runs:
        raise _InputError(f"{label}: no run read" + (f" named {wanted!r}" if wanted else ""))
    if len({r.name for r in runs}) > 1 and any(r.records for r in runs):
        names = ", ".join(sorted({r.name for r in runs}))
        raise _InputError(f"{path} holds several runs ({names}): name one as "
                          f"{path}{_SEPARATOR}RUN")
    # an output_dir holds the same run as TensorBoard, W&B and trainer-state files: the one
    # with the most steps, then the most keys, is compared (said, so it can be given instead)
    chosen = max(runs, key=lambda r: (r.steps, len(r.keys)))
    if len(runs) > 1:
        others = ", ".join(r.source for r in runs if r is not chosen)
        print(f"rlmon diff: {label}: compared {chosen.source} ({chosen.format}, the most steps); "
              f"also there: {others}", file=sys.stderr)
    return from_logged(chosen, label)


def _from_store(label: str, args: argparse.Namespace) -> RunSeries:
    from rlmon.commands.support.history_store import history_path, missing_run
    from rlmon.service.diff.runs import from_step_lines
    from rlmon.service.storage.history import HistoryStore

    db = history_path(args, "diff")
    if db is None:
        raise _InputError(f"{label}: not a file or directory, and no history store to look "
                          "it up in")
    if missing_run(db, label, "diff"):
        raise _InputError(f"{label}: no such file, directory or stored run")
    store = HistoryStore(db)
    try:
        lines = store.steps(label)
    finally:
        store.close()
    return from_step_lines(lines, label, str(db))


def _load(label: str, args: argparse.Namespace) -> RunSeries:
    if Path(label.partition(_SEPARATOR)[0]).exists():
        return _from_path(label)
    return _from_store(label, args)


def run_diff(args: argparse.Namespace) -> int:
    with visible_output():  # names from the files are shown, never obeyed by the terminal
        return _run_diff(args)


def _run_diff(args: argparse.Namespace) -> int:
    from rlmon.service.diff import DiffParams, diff_runs

    try:
        a, b = _load(args.run_a, args), _load(args.run_b, args)
    except _InputError as exc:
        print(f"rlmon diff: {exc}", file=sys.stderr)
        return EXIT_INPUT
    given = {"persist": args.persist, "z": args.z}
    result = diff_runs(a, b, DiffParams(**{k: v for k, v in given.items() if v is not None}))
    if not result.metrics:
        print(f"rlmon diff: {a.label} and {b.label} have no metric with enough common steps "
              f"(only in {a.label}: {len(result.only_a)}, only in {b.label}: "
              f"{len(result.only_b)}, common steps: {result.common_steps})", file=sys.stderr)
        return EXIT_INPUT
    if args.json:
        print(dumps(result.to_json()))
    else:
        from rlmon.service.diff.text import render_text

        print(render_text(result))
    if args.html:
        from rlmon.service.diff.html import render_html

        try:
            Path(args.html).write_text(render_html(result), encoding="utf-8")
        except OSError as exc:
            print(f"rlmon diff: cannot write {args.html}: {exc}", file=sys.stderr)
            return EXIT_INPUT
    return EXIT_OK
