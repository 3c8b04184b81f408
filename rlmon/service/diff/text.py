"""A diff as the terminal prints it."""

from __future__ import annotations

from typing import Any

from rlmon.service.diff.divergence import DiffResult

__all__ = ["render_text"]

_QUIET_SHOWN = 12  # metrics within noise named on one line, then counted


def _value(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else repr(value) if isinstance(
        value, str) else str(value)


def render_text(result: DiffResult) -> str:
    a, b = result.a, result.b
    lines = [f"A: {a.label} ({a.format}, run {a.name}, {a.steps} steps)",
             f"B: {b.label} ({b.format}, run {b.name}, {b.steps} steps)",
             result.headline(), result.compared()]
    if result.settings:
        lines.append("settings that differ (A -> B):")
        lines += [f"  {key}: {_value(va)} -> {_value(vb)}" for key, va, vb in result.settings]
    elif a.config and b.config:
        lines.append("settings: the recorded settings are the same")
    else:
        missing = " and ".join(r.label for r in (a, b) if not r.config)
        lines.append(f"settings: not recorded in {missing}")
    for exact in result.exact_differences:
        lines.append(f"  differs exactly: {exact.describe()}")
    diverged = result.parted
    if diverged:
        lines.append("diverged (the departure's first step; smoothed A vs B where it was confirmed):")
        lines += [f"  {m.describe()}" for m in diverged]
    quiet = [m.metric for m in result.metrics if not m.diverged and not m.telemetry]
    if quiet:
        shown = ", ".join(quiet[:_QUIET_SHOWN])
        more = f" and {len(quiet) - _QUIET_SHOWN} more" if len(quiet) > _QUIET_SHOWN else ""
        lines.append(f"within noise: {shown}{more}")
    machine = result.telemetry
    if machine:
        apart = [m for m in machine if m.diverged]
        lines.append(f"host and hardware telemetry ({len(machine)} series; the machines', not "
                     f"the training's): {len(apart)} differ")
        lines += [f"  {m.describe()}" for m in apart]
    if result.only_a or result.only_b:
        lines.append(f"logged by one run only: A {len(result.only_a)}, B {len(result.only_b)}")
    return "\n".join(lines)
