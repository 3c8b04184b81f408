"""A self-contained HTML page of a diagnosis: per run, its key mapping, its findings with their
context, and a small chart per watched metric with the findings' steps marked. No script, no
external asset: the file can be attached to a CI job or mailed."""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

from rlmon.service.diagnose.findings import Diagnosis, Finding
from rlmon.service.diagnose.logged_run import ReadProblem
from rlmon.service.diagnose.mapping import KeyStatus

__all__ = ["render_html"]

_CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1100px;color:#222}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:2em;border-bottom:1px solid #ccc}
table{border-collapse:collapse;font-size:.9em;margin:.5em 0}td,th{border:1px solid #ddd;
padding:.25em .5em;text-align:left;vertical-align:top}.critical{color:#b00020;font-weight:bold}
.warning{color:#a06000;font-weight:bold}.info{color:#2060a0}.resolved{color:#2a7a2a}
.charts{display:flex;flex-wrap:wrap;gap:1em}.chart{font-size:.8em}.problems{color:#b00020}
code{background:#f4f4f4;padding:0 .2em}"""
_CHART_W, _CHART_H = 260, 80


def _chart(name: str, points: list[tuple[int, float]], marks: list[tuple[int, str]]) -> str:
    finite = [(s, v) for s, v in points if math.isfinite(v)]
    if not finite:
        return ""
    s0, s1 = points[0][0], points[-1][0]
    lo, hi = min(v for _, v in finite), max(v for _, v in finite)
    span_s, span_v = max(s1 - s0, 1), (hi - lo) or 1.0

    def x(step: int) -> float:
        return 4 + (step - s0) / span_s * (_CHART_W - 8)

    def y(value: float) -> float:
        return _CHART_H - 4 - (value - lo) / span_v * (_CHART_H - 8)

    path = " ".join(f"{x(s):.1f},{y(v):.1f}" for s, v in finite)
    lines = "".join(
        f'<line x1="{x(s):.1f}" x2="{x(s):.1f}" y1="0" y2="{_CHART_H}" class="{sev}" '
        f'stroke="{"#b00020" if sev == "critical" else "#a06000"}" stroke-dasharray="3,2"/>'
        for s, sev in marks)
    nan = "".join(f'<circle cx="{x(s):.1f}" cy="4" r="3" fill="#b00020"/>'
                  for s, v in points if not math.isfinite(v))
    return (f'<div class="chart"><div><code>{escape(name)}</code> {lo:.4g} .. {hi:.4g}</div>'
            f'<svg width="{_CHART_W}" height="{_CHART_H}" role="img" aria-label="{escape(name)}">'
            f'<rect width="100%" height="100%" fill="#fafafa"/>{lines}'
            f'<polyline fill="none" stroke="#3050a0" stroke-width="1.5" points="{path}"/>{nan}'
            "</svg></div>")


def _finding_row(f: Finding) -> str:
    value = "n/a" if f.value is None else ("NaN" if f.value != f.value else f"{f.value:.4g}")
    context = "<br>".join(escape(r.describe()) for r in f.related)
    since = "" if f.since in (None, f.step) else f" (since {f.since})"
    cls = "resolved" if f.state == "resolved" else f.severity
    return (f'<tr><td>{f.step}{since}</td><td class="{cls}">{escape(f.alert)}<br>'
            f"{escape(f.severity)} {escape(f.state)}</td><td><code>{escape(f.key)}</code>"
            f"{'' if f.key == f.metric else ' &rarr; ' + escape(f.metric)} = {value}"
            f"<br>{escape(f.value_is)}</td><td>{escape(f.detail)}"
            f"{'<br>' if f.detail and context else ''}{context}</td>"
            f"<td>{escape(f.what_to_check)}</td></tr>")


def _section(d: Diagnosis) -> str:
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
    if d.findings:
        parts.append("<table><tr><th>step</th><th>finding</th><th>value</th><th>around the "
                     "onset</th><th>what to check</th></tr>"
                     + "".join(_finding_row(f) for f in d.findings) + "</table>")
    else:
        parts.append("<p>No finding.</p>")
    series: dict[str, list[tuple[int, float]]] = {}
    for record, _ in d.steps:
        for name, value in record.metrics.items():
            series.setdefault(name, []).append((record.step, value))
    marks = [(f.step, f.severity) for f in d.findings if f.state == "firing"]
    watched = [k.name for k in km.keys if k.status is KeyStatus.CANONICAL] or list(series)
    charts = "".join(_chart(n, series[n], marks) for n in dict.fromkeys(watched) if n in series)
    parts.append(f'<div class="charts">{charts}</div>')
    return "\n".join(parts)


def render_html(diagnoses: Sequence[Diagnosis], problems: Sequence[ReadProblem]) -> str:
    body = ["<h1>rlmon diagnose</h1>"]
    if problems:
        body.append('<ul class="problems">' + "".join(
            f"<li><code>{escape(p.path)}</code>: {escape(p.message)}</li>" for p in problems)
            + "</ul>")
    body += [_section(d) for d in diagnoses]
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>rlmon diagnose</title><style>{_CSS}</style></head><body>"
            + "\n".join(body) + "</body></html>\n")
