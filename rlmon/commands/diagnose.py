"""``rlmon diagnose PATH...``: what went wrong in runs a team already has, and where it began.

Reads TensorBoard, W&B, Hugging Face, verl and rlmon files (docs/diagnose.md), maps their keys
with the framework key maps, runs the rule pack and the sanity layer, and prints the findings.

Exit status: 1 when ``--fail-on`` is given and a finding of that severity or worse fired (the
verdict wins over input problems, so a CI gate never passes a bad run for a damaged file); else
2 when some input could not be read (unreadable, truncated, unrecognised, no known key) or the
rule file is invalid, what could be read still diagnosed; else 0.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING

from rich.markup import escape as esc

from rlmon.commands.support.arguments import gpu_count, gpu_price
from rlmon.commands.support.rule_files import read_rules
from rlmon.service.diagnose.findings import Diagnosis, Finding, diagnose
from rlmon.service.diagnose.formats import read_paths
from rlmon.service.diagnose.logged_run import LoggedRun, ReadProblem
from rlmon.service.diagnose.mapping import KeyStatus
from rlmon.service.json_output import dumps
from rlmon.service.metrics.keymaps import FRAMEWORKS
from rlmon.service.terminal_text import terminal_console, visible_output

if TYPE_CHECKING:
    from rlmon.service.alerting.rules import Rule

__all__ = ["diagnose_each", "register", "run_diagnose"]

EXIT_OK, EXIT_FAIL_ON, EXIT_INPUT = 0, 1, 2
_LEVELS = {"warning": ("warning", "critical"), "critical": ("critical",)}
_GATED_SANITY = {"warning"}  # sanity findings of this severity count for --fail-on warning


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("diagnose", help="diagnose existing runs' logs (TensorBoard, W&B, "
                       "trainer_state.json, verl, rlmon files)")
    p.add_argument("paths", nargs="+", metavar="PATH", help="a log file or a directory of them")
    p.add_argument("--framework", choices=FRAMEWORKS, default=None,
                   help="read the keys with this framework's key map (default: detected)")
    p.add_argument("--rules", help="YAML rule file (on top of the default pack), as for replay")
    p.add_argument("--json", action="store_true",
                   help="JSON lines: a source line per run, a finding line per alert transition")
    p.add_argument("--html", metavar="FILE", help="also write a self-contained HTML report")
    p.add_argument("--fail-on", choices=("warning", "critical"), default=None,
                   help="exit 1 when a finding of this severity (or worse) fired")
    p.add_argument("--gpus", type=gpu_count, default=None, metavar="N",
                   help="GPUs the run used, for GPU-hours (default: the world size its "
                   "settings record, where they do)")
    p.add_argument("--price-per-gpu-hour", type=gpu_price, default=None, metavar="PRICE",
                   help="price the GPU-hours (e.g. 3.0 for $3 a GPU-hour)")
    p.set_defaults(func=run_diagnose)


def _gates(finding: Finding, level: str | None) -> bool:
    if level is None or finding.state == "resolved":
        return False
    return finding.severity in _LEVELS[level]


def _no_known_keys(d: Diagnosis) -> ReadProblem:
    sample = ", ".join(k.key for k in d.keymap.keys[:8]) or "none"
    frameworks = ", ".join(FRAMEWORKS)
    return ReadProblem(d.run.source, f"no key rlmon knows among its {len(d.keymap.keys)} keys "
                       f"({sample}{', ...' if len(d.keymap.keys) > 8 else ''}); expected a "
                       f"framework's logged keys (rlmon catalog --framework {{{frameworks}}}) "
                       "or rlmon's canonical names (rlmon catalog); only NaN/Inf were checked")


def diagnose_each(runs: Sequence[LoggedRun], problems: list[ReadProblem],
                  rules: Sequence[Rule] | None = None, framework: str | None = None,
                  gpus: float | None = None, price: float | None = None) -> list[Diagnosis]:
    """Each run diagnosed on its own: one that fails on what its files hold is a problem named
    by its source, and the others still get their output."""
    out = []
    for run in runs:
        try:
            out.append(diagnose(run, rules, framework, gpus, price))
        except (ValueError, ArithmeticError, RecursionError, MemoryError) as exc:
            problems.append(ReadProblem(run.source, f"cannot be diagnosed: "
                                        f"{type(exc).__name__}: {str(exc)[:200]}"))
    return out


def run_diagnose(args: argparse.Namespace) -> int:
    with visible_output():  # names from the files are shown, never obeyed by the terminal
        return _run_diagnose(args)


def _run_diagnose(args: argparse.Namespace) -> int:
    rules = read_rules(args.rules, "diagnose")
    if rules is None:
        return EXIT_INPUT
    runs, problems = read_paths(args.paths)
    for run in runs:
        problems.extend(run.problems)
    diagnoses = diagnose_each(runs, problems, rules, args.framework, args.gpus,
                              args.price_per_gpu_hour)
    problems.extend(_no_known_keys(d) for d in diagnoses if d.no_known_keys)
    if args.json:
        _print_json(diagnoses, problems, sys.stdout, sys.stderr)
    else:
        _print_terminal(diagnoses, problems)
    if args.rules:  # the team's pack backtested per run, as replay --rules prints it
        from rlmon.commands.replay import print_backtest
        from rlmon.service.alerting.backtest import backtest

        for d in diagnoses:
            tested = backtest(rules, d.steps)
            if args.json:
                for entry in tested:
                    _dump({**entry.to_json(), "source_file": d.run.source}, sys.stderr)
            else:
                print(f"backtest of {args.rules} on {d.run.source}:")
                print_backtest(tested)
    if args.html:
        from rlmon.service.diagnose.html import render_html

        try:
            Path(args.html).write_text(render_html(diagnoses, problems), encoding="utf-8")
        except OSError as exc:
            print(f"rlmon diagnose: cannot write {args.html}: {exc}", file=sys.stderr)
            return EXIT_INPUT
    if any(_gates(f, args.fail_on) for d in diagnoses for f in d.findings):
        return EXIT_FAIL_ON
    return EXIT_INPUT if problems or not diagnoses else EXIT_OK


def _dump(obj: object, out: IO[str]) -> None:
    out.write(dumps(obj) + "\n")


def _summary(diagnoses: Sequence[Diagnosis], problems: Sequence[ReadProblem]) -> dict[str, object]:
    # one count per incident, at its severity at the end (an escalation is its warning's)
    fired = [f for d in diagnoses for f in d.findings
             if f.state != "resolved" and not f.escalated_from]
    return {"type": "summary", "runs": len(diagnoses),
            "steps": sum(d.run.steps for d in diagnoses),
            "critical": sum(f.severity_now == "critical" for f in fired),
            "warning": sum(f.severity_now == "warning" for f in fired),
            "problems": len(problems)}


def _print_json(diagnoses: Sequence[Diagnosis], problems: Sequence[ReadProblem], out: IO[str],
                err: IO[str]) -> None:
    for problem in problems:
        _dump(problem.to_json(), err)
    for d in diagnoses:
        _dump(d.to_json(), out)
        for finding in d.findings:
            _dump({**finding.to_json(), "source_file": d.run.source}, out)
    _dump(_summary(diagnoses, problems), err)


def _colour(severity: str) -> str:
    return {"critical": "red", "warning": "yellow"}.get(severity, "cyan")


def _print_terminal(diagnoses: Sequence[Diagnosis], problems: Sequence[ReadProblem]) -> None:
    console = terminal_console(highlight=False, soft_wrap=not sys.stdout.isatty())

    def plain(text: str) -> None:
        console.print(text, markup=False)
    for problem in problems:
        print(f"cannot read {problem.path}: {problem.message}", file=sys.stderr)
    for d in diagnoses:
        run, km = d.run, d.keymap
        fw = f"{km.framework} ({km.how})" if km.framework else km.how
        console.print(f"[bold]{esc(run.source)}[/bold]: {run.format}, run {esc(run.name)}, "
                      f"{run.steps} steps; framework: {esc(fw)}")
        canonical = km.of_status(KeyStatus.CANONICAL)
        plain(f"  keys: {len(canonical)} canonical ("
                      + ", ".join(f"{k.key} -> {k.name}" if k.key != k.name else k.key
                                  for k in canonical) + ")")
        for status in (KeyStatus.RELAYED, KeyStatus.EVALUATION, KeyStatus.UNKNOWN):
            found = km.of_status(status)
            if found:
                plain(f"  {status.value}: " + ", ".join(k.key for k in found))
        lossy = [k.key for k in km.keys if k.lossy]
        if lossy:
            plain("  reduced lossily by the framework (not comparable across runs): "
                          + ", ".join(lossy))
        for segment in run.segments:  # the settings read, per resumed process
            plain(f"  settings from step {segment.first_step}: {segment.settings.describe()}")
        for note in run.notes:
            plain(f"  note: {note}")
        if d.clock is not None:
            plain(f"  {d.clock.describe()}")
        elif d.unpriced:
            plain(f"  cost: {d.unpriced}")
        for projection in d.projections:
            plain(f"  heading: {projection.describe(d.seconds_per_step)}")
        if not d.findings:
            console.print("  [green]no finding[/green]")
        for f in d.findings:
            _print_finding(console, f)
        console.print()
    s = _summary(diagnoses, problems)
    runs = "run" if s["runs"] == 1 else "runs"
    console.print(f"{s['runs']} {runs}, {s['steps']} steps: {s['critical']} critical, "
                  f"{s['warning']} warning findings; {s['problems']} input problems")


def _print_finding(console: object, f: Finding) -> None:
    from rich.console import Console

    assert isinstance(console, Console)
    value = "n/a" if f.value is None else (f"{f.value:.4g}" if f.value == f.value else "NaN")
    key = f.key if f.key == f.metric else f"{f.metric} ({f.key})"
    if f.state == "resolved" and f.handed_to:
        console.print(f"  [{_colour(f.severity)}]{f.alert} handed over[/] at step {f.step} to "
                      f"{esc(f.handed_to)}, which judges this level and fires now: "
                      f"{esc(key)} = {value}")
        return
    if f.state == "resolved":
        console.print(f"  [{_colour(f.severity)}]{f.alert} resolved[/] at step {f.step}: "
                      f"{esc(key)} = {value}")
        return
    if f.escalated_from:
        crossed = f", first past the critical level at step {f.since}" \
            if f.since is not None and "critical level" in f.condition else ""
        since = f" (escalated from {f.escalated_from}{crossed})"
    else:
        since = f" (condition held since step {f.since})" if f.since not in (None, f.step) \
            else ""
    label = f.severity.upper()
    console.print(f"  [{_colour(f.severity)}]{label} {f.alert}[/] at step {f.step}{since}: "
                  + esc(f"{key} = {value}" + (f" ({f.condition})" if f.condition else "")))
    if f.escalated_from:
        console.print(f"    escalated from {f.escalated_from}: the same incident as the "
                      f"{f.escalated_from} above, its cost counted there once", markup=False)
    if f.value_is:
        console.print(f"    value: {f.value_is}", markup=False)
    if f.detail:
        console.print(f"    {f.detail}", markup=False)
    if f.related:
        console.print("    around the onset:")
        for related in f.related:
            console.print(f"      {related.describe()}", markup=False)
    if f.escalated_at is not None:
        console.print(f"    severity now: critical (escalated at step {f.escalated_at})",
                      markup=False)
    if f.first_moved:
        console.print(f"    what moved first: {f.first_moved}", markup=False)
    if f.cost is not None:
        console.print(f"    cost: {f.cost.describe()}", markup=False)
    if f.what_to_check:
        console.print(f"    check: {f.what_to_check}", markup=False)
    if f.what_to_change:
        console.print(f"    change: {f.what_to_change}", markup=False)
