"""A diff as one self-contained HTML page: the verdict, the settings that differ, each metric's
verdict, and the diverged metrics' curves of both runs with the step they part ways marked.
No script, no external asset; every text from a log is escaped."""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

from rlmon.service.diff.divergence import DiffResult

__all__ = ["render_html"]

_CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1100px;color:#222}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:2em;border-bottom:1px solid #ccc}
table{border-collapse:collapse;font-size:.9em;margin:.5em 0}td,th{border:1px solid #ddd;
padding:.25em .5em;text-align:left;vertical-align:top}.diverged{color:#b00020;font-weight:bold}
.quiet{color:#2a7a2a}.charts{display:flex;flex-wrap:wrap;gap:1em}.chart{font-size:.8em}
code{background:#f4f4f4;padding:0 .2em}.a{color:#1f77b4}.b{color:#d62728}"""
_W, _H, _PAD = 460, 180, 30


def _points(curve: Sequence[tuple[int, float]], x0: int, x1: int, y0: float, y1: float) -> str:
    out = []
    for step, value in curve:
        if not math.isfinite(value):
            continue
        x = _PAD + (step - x0) / max(x1 - x0, 1) * (_W - 2 * _PAD)
        y = _H - _PAD - (value - y0) / (y1 - y0 or 1) * (_H - 2 * _PAD)
        out.append(f"{x:.1f},{y:.1f}")
    return " ".join(out)


def _chart(name: str, a: Sequence[tuple[int, float]], b: Sequence[tuple[int, float]],
           onset: int | None) -> str:
    values = [v for _, v in (*a, *b) if math.isfinite(v)]
    steps = [s for s, _ in (*a, *b)]
    if not values:
        return ""
    x0, x1, y0, y1 = min(steps), max(steps), min(values), max(values)
    mark = ""
    if onset is not None:
        x = _PAD + (onset - x0) / max(x1 - x0, 1) * (_W - 2 * _PAD)
        mark = (f'<line x1="{x:.1f}" y1="{_PAD - 10}" x2="{x:.1f}" y2="{_H - _PAD}" '
                f'stroke="#888" stroke-dasharray="4 3"><title>parts at step {onset}</title>'
                f'</line><text x="{x + 3:.1f}" y="{_PAD - 12}" font-size="10">step {onset}'
                "</text>")
    return (f'<div class="chart"><b>{escape(name)}</b><br><svg width="{_W}" height="{_H}" '
            f'role="img" aria-label="{escape(name, quote=True)}">'
            f'<polyline fill="none" stroke="#1f77b4" points="{_points(a, x0, x1, y0, y1)}"/>'
            f'<polyline fill="none" stroke="#d62728" points="{_points(b, x0, x1, y0, y1)}"/>'
            f'{mark}<text x="{_PAD}" y="{_H - 8}" font-size="10">{x0}</text>'
            f'<text x="{_W - _PAD}" y="{_H - 8}" font-size="10" text-anchor="end">{x1}</text>'
            f'<text x="2" y="{_PAD}" font-size="10">{y1:.4g}</text>'
            f'<text x="2" y="{_H - _PAD}" font-size="10">{y0:.4g}</text></svg></div>')


def render_html(result: DiffResult) -> str:
    a, b = result.a, result.b
    parts = [f"<h1>rlmon diff</h1><p><b>{escape(result.headline())}</b></p>",
             "<table><tr><th></th><th>run</th><th>source</th><th>format</th><th>steps</th></tr>"]
    for tag, run in (("A", a), ("B", b)):
        parts.append(f'<tr><td class="{tag.lower()}">{tag}</td><td>{escape(run.name)}</td>'
                     f"<td><code>{escape(run.source)}</code></td><td>{escape(run.format)}</td>"
                     f"<td>{run.steps}</td></tr>")
    parts.append("</table><h2>Settings that differ</h2>")
    if result.settings:
        parts.append("<table><tr><th>setting</th><th>A</th><th>B</th></tr>" + "".join(
            f"<tr><td><code>{escape(k)}</code></td><td>{escape(str(va))}</td>"
            f"<td>{escape(str(vb))}</td></tr>" for k, va, vb in result.settings) + "</table>")
    else:
        parts.append("<p>None recorded as different"
                     + ("" if a.config and b.config else " (a run recorded no settings)")
                     + ".</p>")
    parts.append("<h2>Curves</h2><p><span class=\"a\">&#9632; A</span> "
                 "<span class=\"b\">&#9632; B</span></p><div class=\"charts\">")
    onsets = {m.metric: m.onset for m in result.metrics}
    for name, (ca, cb) in result.curves.items():
        parts.append(_chart(name, ca, cb, onsets.get(name)))
    parts.append("</div><h2>Every metric</h2><table><tr><th>metric</th><th>verdict</th>"
                 "<th>scale</th><th>noise A / B</th><th>wander A / B</th></tr>")
    for m in result.metrics:
        cls = "diverged" if m.diverged else "quiet"
        parts.append(f'<tr><td><code>{escape(m.metric)}</code></td><td class="{cls}">'
                     f"{escape(m.describe())}</td><td>{m.scale}</td>"
                     f"<td>{m.noise_a:.3g} / {m.noise_b:.3g}</td>"
                     f"<td>{m.wander_a:.3g} / {m.wander_b:.3g}</td></tr>")
    parts.append("</table>")
    return ("<!doctype html><html><head><meta charset=\"utf-8\"><title>rlmon diff: "
            f"{escape(a.label)} vs {escape(b.label)}</title><style>{_CSS}</style></head><body>"
            + "\n".join(parts) + "</body></html>\n")
