"""The diagnosis as one self-contained HTML file: per run, the run report of ``rlmon report``
(:mod:`rlmon.service.report`: alerts with onset and resolve, key curves with alert markers),
built from the diagnosed steps and transitions in an in-memory history store, preceded by what
only a diagnosis knows: how each key was mapped and each finding's context and what to check.
No script, no external asset: the file can be attached to a CI job or mailed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from html import escape
from typing import TYPE_CHECKING, Any

from rlmon.service.diagnose.findings import Diagnosis, Finding
from rlmon.service.diagnose.logged_run import ReadProblem
from rlmon.service.diagnose.mapping import KeyStatus

if TYPE_CHECKING:
    from rlmon.service.report.model import RunReport
    from rlmon.service.storage.history import HistoryStore

__all__ = ["render_html", "run_report"]

_CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1100px;color:#222}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:2em;border-bottom:1px solid #ccc}
table{border-collapse:collapse;font-size:.9em;margin:.5em 0}td,th{border:1px solid #ddd;
padding:.25em .5em;text-align:left;vertical-align:top}.critical{color:#b00020;font-weight:bold}
.warning{color:#a06000;font-weight:bold}.info{color:#2060a0}.resolved{color:#2a7a2a}
.charts{display:flex;flex-wrap:wrap;gap:1em}.chart{font-size:.8em}.problems{color:#b00020}
code{background:#f4f4f4;padding:0 .2em}"""
def _finding_row(f: Finding) -> str:
    value = "n/a" if f.value is None else ("NaN" if f.value != f.value else f"{f.value:.4g}")
    context = "<br>".join(escape(r.describe()) for r in f.related)
    since = "" if f.since in (None, f.step) else f" (since {f.since})"
    cls = "resolved" if f.state == "resolved" else f.severity
    return (f'<tr><td>{f.step}{since}</td><td class="{cls}">{escape(f.alert)}<br>'
            f"{escape(f.severity)} {escape(f.state)}</td><td><code>{escape(f.key)}</code>"
            f"{'' if f.key == f.metric else ' &rarr; ' + escape(f.metric)} = {value}"
            f"<br>{escape(f.value_is)}</td><td>{escape(f.detail)}"
            f"{'<br>' if f.detail and context else ''}{context}"
            f"{'<br>cost: ' + escape(f.cost.describe()) if f.cost is not None else ''}</td>"
            f"<td>{escape(f.what_to_check)}</td></tr>")


def _section(d: Diagnosis) -> tuple[str, str]:
    """(the run report's stylesheet, this run's section)."""
    run, km = d.run, d.keymap
    parts = [f"<h2>{escape(run.name)} <small>({escape(run.format)}: "
             f"<code>{escape(run.source)}</code>, {run.steps} steps)</small></h2>",
             f"<p>framework: <b>{escape(km.framework or 'none')}</b> ({escape(km.how)})</p>"]
    rows = "".join(
        f"<tr><td><code>{escape(k.key)}</code></td><td>{escape(k.status.value)}</td>"
        f"<td>{escape(k.name)}</td><td>{escape(k.describe())}</td></tr>"
        for k in km.keys if k.status is not KeyStatus.BOOKKEEPING)
    parts.append("<details><summary>keys</summary><table><tr><th>logged key</th><th>status"
                 f"</th><th>evaluated as</th><th>value</th></tr>{rows}</table></details>")
    parts += [f"<p>note: {escape(n)}</p>" for n in run.notes]
    if d.clock is not None:
        parts.append(f"<p>{escape(d.clock.describe())}</p>")
    parts += [f"<p>heading: {escape(p.describe(d.seconds_per_step))}</p>"
              for p in d.projections]
    if d.findings:
        parts.append("<table><tr><th>step</th><th>finding</th><th>value</th><th>around the "
                     "onset</th><th>what to check</th></tr>"
                     + "".join(_finding_row(f) for f in d.findings) + "</table>")
    else:
        parts.append("<p>No finding.</p>")
    style, report = _run_report(d)
    parts.append(report)
    return style, "\n".join(parts)


class _WithoutSteps:
    """A history store as the report reads it, without step lines: a long log's alert
    transitions are in the store (a few rows); the report's parts made from steps (the role
    summary, the curves) are made from the log's columns instead."""

    def __init__(self, store: HistoryStore) -> None:
        self._store = store

    def steps(self, run: str | None = None, role: str | None = None) -> Sequence[Any]:
        return ()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def _thinned(steps: Any, values: Any, present: Any, width: int) -> list[tuple[int, float]]:
    """A column's finite points, each run of ``width`` kept as its lowest and its highest (as
    the report thins a curve), with numpy: a million steps in milliseconds."""
    import numpy as np

    keep = present & np.isfinite(values)
    xs, ys = steps[keep], values[keep]
    if width > 1 and len(ys) > width:
        rows = -(-len(ys) // width)
        padded = np.full(rows * width, np.nan)
        padded[:len(ys)] = ys
        grid = padded.reshape(rows, width)
        base = np.arange(rows) * width
        chosen = np.unique(np.concatenate([base + np.nanargmin(grid, axis=1),
                                           base + np.nanargmax(grid, axis=1)]))
        xs, ys = xs[chosen], ys[chosen]
    return list(zip(xs.tolist(), ys.tolist(), strict=True))


def run_report(d: Diagnosis) -> RunReport:
    """``rlmon report``'s report of a diagnosed run, from its steps and transitions. A long
    log's steps are never turned into step lines: its role summary and curves come straight
    from its columns (``diagnose --html`` of a million entries in about the text's time and
    memory)."""
    from rlmon.service.diagnose.columns import RecordView
    from rlmon.service.diagnose.findings import LoggedSteps
    from rlmon.service.report.model import (
        RoleSummary,
        build_report,
        curve_metrics,
        curves_from,
        thinning_width,
    )
    from rlmon.service.storage.history import HistoryStore

    steps = d.steps
    store = HistoryStore(":memory:")
    try:
        if not isinstance(steps, LoggedSteps) or not isinstance(steps.records, RecordView):
            # records held already (rlmon's own files, a short log), with their timelines and
            # samples: the report reads them from the store as it reads a service's
            store.add([record for record, _ in steps],
                      [event for _, events in steps for event in events])
            return log_story(build_report(store, d.run.name), d)
        records = steps.records
        store.add([], steps.events)
        report = build_report(_WithoutSteps(store), d.run.name)  # type: ignore[arg-type]
        if not len(records):
            return log_story(report, d)
        at = records.steps()
        width = thinning_width(len(records))
        series = {(records.role, name): _thinned(at, *records.column(name), width)
                  for name in curve_metrics(report.alerts) if name in records.names}
        role = RoleSummary(records.role, len(records), int(at.min()), int(at.max()), 0, 1, 1)
        return log_story(replace(report, roles=(role,),
                                 curves=tuple(curves_from(series, report.alerts))), d)
    finally:
        store.close()


def log_story(report: RunReport, d: Diagnosis) -> RunReport:
    """A log's report telling the diagnosis' story: each alert priced as ``diagnose`` prices
    it (its span of the log's steps, at the GPUs given or read, priced once per incident),
    and what a log cannot know (goodput, slowest ranks and stages: they need per-rank step
    timelines; the GPUs per rank of a live service) said once instead of zeros."""

    costs = {(f.alert, f.step): f for f in d.findings if f.cost is not None}
    gpus = d.clock.gpus if d.clock is not None else None
    alerts = []
    for a in report.alerts:
        f = costs.get((a.alert, a.fired_step))
        if f is not None and f.cost is not None:
            a = replace(a, gpus=gpus, gpu_hours=f.cost.gpu_hours, money=f.cost.money,
                        cost_note=f.cost.describe())
        else:  # why nothing is priced is said once, in the notes, not on every alert
            a = replace(a, gpus=gpus, gpu_hours=None, money=None, cost_note="")
        alerts.append(a)
    notes = ("a log has no per-rank step timelines: no goodput, slowest ranks or stages",
             *((d.unpriced,) if d.unpriced else ()))
    return replace(report, alerts=tuple(alerts), notes=notes, goodput={}, goodput_reasons=(),
                   goodput_steps=(), gpu_hours=(
        d.clock.gpu_hours(d.clock.total_seconds) or 0.0) if d.clock is not None else 0.0)


def _run_report(d: Diagnosis) -> tuple[str, str]:
    """(stylesheet, body) of ``rlmon report``'s page for this run, from its steps and
    transitions."""
    from rlmon.service.report.html import render_html as report_html

    page = report_html(run_report(d))
    style = page.split("<style>", 1)[1].split("</style>", 1)[0]
    body = page.split("<body>", 1)[1].rsplit("</body>", 1)[0]
    for tag in ("h1", "h2"):  # under this run's heading
        body = body.replace(f"<{tag}", "<h3").replace(f"</{tag}>", "</h3>")
    return style, body


def render_html(diagnoses: Sequence[Diagnosis], problems: Sequence[ReadProblem]) -> str:
    body = ["<h1>rlmon diagnose</h1>"]
    if problems:
        body.append('<ul class="problems">' + "".join(
            f"<li><code>{escape(p.path)}</code>: {escape(p.message)}</li>" for p in problems)
            + "</ul>")
    sections = [_section(d) for d in diagnoses]
    body += [section for _, section in sections]
    style = sections[0][0] if sections else ""
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>rlmon diagnose</title><style>{style}{_CSS}</style></head><body>"
            + "\n".join(body) + "</body></html>\n")
