"""The run report as terminal text: a few aligned sections, widest facts first."""

from __future__ import annotations

import math

from rlmon.service.report.model import RunReport
from rlmon.service.wording import counted, format_value

__all__ = ["render_text"]


def _num(value: float | None, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return f"{value:.{digits}g}"


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:5.1f} %" if whole > 0 else "  n/a"


def render_text(report: RunReport) -> str:
    out = [f"rlmon report: run {report.run}", ""]
    if report.run_states:
        out.append("Run state")
        for st in report.run_states:
            last = "" if st["last_step"] is None else f", last step {st['last_step']}"
            out.append(f"  {st['role']:<10} {st['state']}{last}"
                       + (f": {st['detail']}" if st["detail"] else ""))
        out.append("")
    out.append("Steps")
    for r in report.roles:
        out.append(f"  {r.role:<10} {r.steps:>6} steps ({r.first}..{r.last}), "
                   f"{counted(r.ranks, 'rank')}, {r.incomplete} incomplete, "
                   f"{counted(r.attempts, 'attempt')}")
    total = sum(report.goodput.values())
    if report.steps_accounted:
        out += ["", f"Goodput {_num(report.goodput_ratio, 3)} over {report.steps_accounted} "
                f"steps, {report.gpu_hours:.4g} GPU-hours"
                + (f", MFU {_num(report.mfu, 3)}" if report.mfu is not None else "")]
        for bucket, seconds in report.goodput.items():
            out.append(f"  {bucket:<10} {seconds:>12.4g} GPU-s  {_pct(seconds, total)}")
        for bucket, why, seconds in report.goodput_reasons:
            out.append(f"    {bucket + '/' + why:<28} {seconds:>12.4g} GPU-s  "
                       f"{_pct(seconds, total)}")
    out += ["", f"Alerts ({len(report.alerts)})"]
    for a in report.alerts:
        until = "still firing" if a.resolved_step is None else (
            f"still firing when the run ended at step {a.resolved_step}" if a.ended_with_run
            else f"handed over to {a.handed_to} at step {a.resolved_step}" if a.handed_to
            else f"resolved at step {a.resolved_step}")
        severity = a.severity if a.escalated_step is None else \
            f"warning, escalated to {a.severity} at step {a.escalated_step}"
        # None: a store that kept no cost (written before costs were); "": said once in the notes
        cost = f"; {a.cost_note}" if a.cost_note else "; cost unknown" if a.cost_note is None \
            else ""
        out.append(f"  {a.alert} [{severity}] {a.role} step {a.fired_step} "
                   f"({a.metric} = {format_value(a.value)}), {until}{cost}")
        for item in a.samples:
            text = " ".join(str(item["payload"]).split())[:80]
            out.append(f"      {a.samples_metric} {item['id']} {_num(item['score'])}: {text}")
    if report.slowest_ranks:  # none without timelines (a log): said once in the notes
        out += ["", "Slowest ranks (times the slowest of a step)"]
    for rank in report.slowest_ranks:
        where = " ".join(f"{k}={v}" for k, v in rank["rank"].items())
        out.append(f"  {rank['role']:<10} {where:<22} {rank['times_slowest']:>5} steps, median "
                   f"{rank['median_ratio']:.3g}x the median rank, max {rank['max_ratio']:.3g}x")
    if report.slowest_stages:
        out += ["", "Slowest stages (seconds per rank and step)"]
    for s in report.slowest_stages:
        out.append(f"  {s['role']:<10} {s['span']:<28} mean {s['mean_seconds']:.4g} s, max "
                   f"{s['max_seconds']:.4g} s over {s['steps']} steps")
    out += ["", "Curves"]
    for c in report.curves:
        values = [v for _, v in c.points]
        out.append(f"  {c.role}/{c.metric}: {len(values)} steps, first {_num(values[0])}, last "
                   f"{_num(values[-1])}, min {_num(min(values))}, max {_num(max(values))}"
                   + (f"; {counted(len(c.markers), 'alert marker')}" if c.markers else ""))
    if report.notes:
        out += ["", "Notes"] + [f"  {n}" for n in report.notes]
    return "\n".join(out) + "\n"
