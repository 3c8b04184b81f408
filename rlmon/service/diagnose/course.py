"""A diagnosis' cost and course: what each finding's span cost (:mod:`.cost`) and where the
run's metrics were heading at its end (:mod:`rlmon.service.alerting.projection`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from rlmon.service.alerting.projection import WINDOW, Projection, project_metric, targets
from rlmon.service.alerting.rules import Rule
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.diagnose.cost import RunClock, run_clock, span_words
from rlmon.service.diagnose.logged_run import LoggedRun
from rlmon.service.diagnose.mapping import KeyMap
from rlmon.service.metrics import catalog

if TYPE_CHECKING:
    from rlmon.service.diagnose.findings import Finding

__all__ = ["clock_of", "priced", "projections"]

_TAIL = 8 * WINDOW  # records looked at for the recent values (a key logged every few steps)


def clock_of(run: LoggedRun, keymap: KeyMap, gpus: float | None,
             price: float | None) -> RunClock | None:
    """The run's step times (and GPUs, price), from the key the key map took for the step time
    where it took one."""
    info = keymap.by_name().get(catalog.STEP_SECONDS)
    return run_clock(run, info.key if info else None, gpus, price)


def priced(findings: Sequence[Finding], clock: RunClock | None) -> list[Finding]:
    """Each firing with the cost of its span: from the step its condition began to the step
    before it resolved (the run's last step while it never did). A warning's escalation is the
    same incident: its cost is the warning's, counted there once."""
    if clock is None or not clock.steps:
        return list(findings)
    end_of_run = clock.steps[-1]
    out = []
    for index, finding in enumerate(findings):
        if finding.state != "firing" or finding.escalated_from:
            out.append(finding)
            continue
        resolved = next((f.step for f in findings[index + 1:] if f.state == "resolved"
                         and (f.run, f.role, f.alert) == (finding.run, finding.role,
                                                          finding.alert)), None)
        first = finding.since if finding.since is not None else finding.step
        last = end_of_run if resolved is None else max(first, resolved - 1)
        out.append(replace(finding, cost=clock.span(first, last, span_words(finding.alert))))
    return out


def projections(records: Sequence[StepRecord], rules: Sequence[Rule]) -> list[Projection]:
    """Per stream, where each metric with a known floor or ceiling was heading over its last
    ``WINDOW`` values, nearest level first."""
    tail = records[max(0, len(records) - _TAIL):]
    streams: dict[tuple[str, str], list[StepRecord]] = {}
    for record in tail:
        streams.setdefault((record.run, record.role), []).append(record)
    wanted = targets(rules)
    out = []
    for stream in streams.values():
        for metric in wanted:
            points = [(r.step, r.metrics[metric]) for r in stream
                      if metric in r.metrics and math.isfinite(r.metrics[metric])]
            if len(points) < 2:
                continue
            xs, ys = zip(*points[-WINDOW:], strict=True)
            found = project_metric(metric, xs, ys, rules)
            out.extend(found[:1])
    return sorted(out, key=lambda p: p.steps)
