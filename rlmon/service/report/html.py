"""The run report as one self-contained HTML file: every plot embedded as a base64 PNG, no
script, no stylesheet or font from the network, so it can be attached to an incident and opened
anywhere.

:func:`render_html` is the entry point (``rlmon report --html`` and anything else that has a
:class:`~rlmon.service.report.model.RunReport`, such as a diagnosis, use it).
"""

from __future__ import annotations

import base64
import functools
import html
import io
import math
from collections.abc import Callable, Collection, Sequence
from typing import Any, ParamSpec

from rlmon.service.goodput.buckets import Bucket
from rlmon.service.report.model import Curve, RunReport
from rlmon.service.wording import counted, format_value

__all__ = ["BUCKET_COLOURS", "plain_text_plots", "render_html"]

_P = ParamSpec("_P")

BUCKET_COLOURS = {Bucket.PRODUCTIVE.value: "#2e7d32", Bucket.OVERHEAD.value: "#1565c0",
                  Bucket.IDLE.value: "#9e9e9e", Bucket.WASTED.value: "#c62828"}
_STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.5em; } h2 { border-bottom: 1px solid #ccc; margin-top: 2em; }
table { border-collapse: collapse; margin: .5em 0; }
td, th { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; } td.n { text-align: right; font-variant-numeric: tabular-nums; }
.firing { color: #c62828; font-weight: 600; } .muted { color: #777; }
figure { margin: .5em 0; } figcaption { font-size: .9em; color: #555; }
.samples { font-family: ui-monospace, monospace; font-size: .85em; white-space: pre-wrap; }
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _num(value: float | None, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return f"{value:.{digits}g}"


def _png(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=80)
    plt.close(fig)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _img(data: str, alt: str, caption: str, kind: str) -> str:
    return (f'<figure class="{kind}"><img alt="{_e(alt)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{_e(caption)}</figcaption></figure>")


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plain_text_plots(draw: Callable[_P, str]) -> Callable[_P, str]:
    """Draw with every label as plain text: a metric or alert name is the run's, not ours, and
    matplotlib's mathtext would read ``$\\frac{a}{b}$`` as a fraction and fail the whole page
    on ``$\\undefinedmacro$``. The one way text reaches a plot (the medium's escaping)."""

    @functools.wraps(draw)
    def plain(*args: _P.args, **kwargs: _P.kwargs) -> str:
        import matplotlib

        with matplotlib.rc_context({"text.parse_math": False}):
            return draw(*args, **kwargs)

    return plain


@plain_text_plots
def _curve_png(curve: Curve) -> str:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 2.2))
    xs = [x for x, _ in curve.points]
    ys = [y for _, y in curve.points]
    ax.plot(xs, ys, marker=".", linewidth=1.2, color="#1565c0")
    for step, alert, state in curve.markers:
        firing = state == "firing"
        ax.axvline(step, color="#c62828" if firing else "#2e7d32", alpha=.7,
                   linestyle="--" if firing else ":")
        if firing:
            ax.annotate(alert, (step, 1), xycoords=("data", "axes fraction"), color="#c62828",
                        fontsize=7, va="top", rotation=90)
    ax.set_ylabel(curve.metric, fontsize=8)
    ax.set_xlabel("step", fontsize=8)
    ax.tick_params(labelsize=7)
    fig.tight_layout()
    return _png(fig)


@plain_text_plots
def _goodput_png(steps: Sequence[tuple[int, int, Any]]) -> str:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 2.8))
    xs = list(range(len(steps)))
    bottom = [0.0] * len(steps)
    for bucket, colour in BUCKET_COLOURS.items():
        values = [float(b.get(bucket, 0.0)) for _, _, b in steps]
        ax.bar(xs, values, bottom=bottom, color=colour, label=bucket, width=.9)
        bottom = [a + b for a, b in zip(bottom, values, strict=True)]
    labels = [f"{s}" if a == 0 else f"{a}:{s}" for a, s, _ in steps]
    every = max(1, len(xs) // 20)
    ax.set_xticks(xs[::every], labels[::every], fontsize=7)
    ax.set_xlabel("step (attempt:step after a restart)", fontsize=8)
    ax.set_ylabel("GPU-seconds", fontsize=8)
    ax.legend(fontsize=7, ncol=4, loc="upper left")
    ax.tick_params(labelsize=7)
    fig.tight_layout()
    return _png(fig)


def _table(head: Sequence[str], rows: Sequence[Sequence[str]],
           numeric: Collection[int] = ()) -> str:
    out = ["<table><tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>"]
    for row in rows:
        out.append("<tr>" + "".join(
            f'<td class="n">{cell}</td>' if i in numeric else f"<td>{cell}</td>"
            for i, cell in enumerate(row)) + "</tr>")
    return "".join(out) + "</table>"


def render_html(report: RunReport) -> str:
    """The whole report as one HTML document (plots inline, nothing fetched)."""
    parts = [f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
             f"<title>rlmon report: {_e(report.run)}</title><style>{_STYLE}</style></head><body>",
             f"<h1>rlmon report: run {_e(report.run)}</h1>"]
    total = sum(report.goodput.values())
    firing = sum(1 for a in report.alerts if a.resolved_step is None)
    ended = sum(1 for a in report.alerts if a.ended_with_run)
    goodput = (f"Goodput <b>{_num(report.goodput_ratio, 3)}</b> over {report.steps_accounted} "
               f"accounted steps ({report.gpu_hours:.4g} GPU-hours)"
               + (f", MFU {_num(report.mfu, 3)}" if report.mfu is not None else "") + "; "
               ) if report.steps_accounted else ""  # none without timelines: said in the notes
    parts.append(
        f"<p>{goodput}{counted(len(report.alerts), 'alert')}"
        + (f', <span class="firing">{firing} still firing</span>' if firing else "")
        + (f', <span class="firing">{ended} firing when the run ended</span>' if ended else "")
        + ".</p>")
    if report.run_states:
        parts.append('<h2 id="state">Run state</h2>')
        parts.append(_table(["role", "state", "last step", "where / how it ended"], [
            [_e(st["role"]), _e(st["state"]),
             "" if st["last_step"] is None else str(st["last_step"]), _e(st["detail"])]
            for st in report.run_states], {2}))
    parts.append('<h2 id="steps">Steps and attempts</h2>')
    parts.append(_table(["role", "steps", "first", "last", "ranks", "incomplete", "attempts"], [
        [_e(r.role), str(r.steps), str(r.first), str(r.last), str(r.ranks), str(r.incomplete),
         str(r.attempts)] for r in report.roles], {1, 2, 3, 4, 5, 6}))
    parts.append('<h2 id="alerts">Alerts and what they cost</h2>')
    if report.alerts:
        rows = []
        for a in report.alerts:
            resolved = ('<span class="firing">firing</span>' if a.resolved_step is None else
                        f'<span class="firing">firing when the run ended at step '
                        f'{a.resolved_step}</span>' if a.ended_with_run
                        else f"handed over to {_e(a.handed_to)} at step {a.resolved_step}"
                        if a.handed_to else str(a.resolved_step))
            money = (f"{report.currency} {a.money:,.2f}" if a.money is not None else "")
            severity = a.severity if a.escalated_step is None else \
                f"warning, escalated to {a.severity} at step {a.escalated_step}"
            rows.append([_e(a.alert), _e(severity), _e(a.role), _e(a.metric), format_value(a.value),
                         str(a.fired_step), resolved,
                         _num(a.gpus, 6) if a.gpus is not None else "n/a",
                         _num(a.gpu_hours), _e(money),
                         _e("cost unknown" if a.cost_note is None else a.cost_note)])
        parts.append(_table(["alert", "severity", "role", "metric", "value", "fired at step",
                             "until", "GPUs", "GPU-hours", "money", "cost"], rows,
                            {4, 5, 7, 8}))
        for a in report.alerts:
            if a.samples:
                lines = "\n".join(
                    f"{s['id']}  {_num(s['score'])}  {' '.join(str(s['payload']).split())[:300]}"
                    for s in a.samples)
                parts.append(f"<h3>Worst samples behind {_e(a.alert)} (step {a.fired_step}, "
                             f"{_e(a.samples_metric)})</h3><div class=\"samples\">{_e(lines)}</div>")
    else:
        parts.append('<p class="muted">No alert fired.</p>')
    if report.steps_accounted:
        _goodput_section(parts, report, total)
    if report.slowest_ranks or report.slowest_stages:
        _slowest_section(parts, report)
    parts.append('<h2 id="curves">Key curves (red: an alert fired; green: it resolved)</h2>')
    for curve in report.curves:
        parts.append(_img(_curve_png(curve), f"{curve.role} {curve.metric}",
                          f"{curve.role}: {curve.metric}", "curve"))
    if report.notes:
        parts.append('<h2 id="notes">Notes</h2><ul>'
                     + "".join(f"<li>{_e(n)}</li>" for n in report.notes) + "</ul>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _goodput_section(parts: list[str], report: RunReport, total: float) -> None:
    parts.append('<h2 id="goodput">Goodput: where the GPU-hours went</h2>')
    parts.append(_table(["bucket", "GPU-seconds", "share"], [
        [_e(b), f"{v:.4g}", f"{100 * v / total:.1f} %" if total > 0 else "n/a"]
        for b, v in report.goodput.items()], {1, 2}))
    parts.append(_table(["bucket", "reason", "GPU-seconds", "share"], [
        [_e(b), _e(why), f"{v:.4g}", f"{100 * v / total:.1f} %" if total > 0 else "n/a"]
        for b, why, v in report.goodput_reasons], {2, 3}))
    if report.goodput_steps:
        parts.append(_img(_goodput_png(report.goodput_steps), "goodput by bucket per step",
                          "GPU-seconds by bucket, step by step", "goodput"))


def _slowest_section(parts: list[str], report: RunReport) -> None:
    parts.append('<h2 id="slowest">Slowest ranks and stages</h2>')
    parts.append(_table(["role", "rank", "times the slowest", "median ratio", "max ratio"], [
        [_e(r["role"]), _e(" ".join(f"{k}={v}" for k, v in r["rank"].items())),
         str(r["times_slowest"]), f"{r['median_ratio']:.3g}", f"{r['max_ratio']:.3g}"]
        for r in report.slowest_ranks], {2, 3, 4}))
    parts.append(_table(["role", "span", "steps", "mean s per rank", "max s per rank"], [
        [_e(s["role"]), _e(s["span"]), str(s["steps"]), f"{s['mean_seconds']:.4g}",
         f"{s['max_seconds']:.4g}"] for s in report.slowest_stages], {2, 3, 4}))
