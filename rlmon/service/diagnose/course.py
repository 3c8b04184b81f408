"""A diagnosis' clock and course: the run's step times that each finding's span is priced with
(:mod:`.cost`) and where the run's metrics were heading at its end
(:mod:`rlmon.service.alerting.projection`)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from rlmon.service.alerting.projection import WINDOW, Projection, project_metric, targets
from rlmon.service.alerting.rules import Rule
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.diagnose.cost import RunClock, run_clock
from rlmon.service.diagnose.logged_run import LoggedRun
from rlmon.service.diagnose.mapping import KeyMap
from rlmon.service.metrics import catalog

__all__ = ["clock_of", "projections"]

_TAIL = 8 * WINDOW  # records looked at for the recent values (a key logged every few steps)


def clock_of(run: LoggedRun, keymap: KeyMap, gpus: float | None,
             price: float | None) -> RunClock | None:
    """The run's step times (and GPUs, price), from the key the key map took for the step time
    where it took one."""
    info = keymap.by_name().get(catalog.STEP_SECONDS)
    return run_clock(run, info.key if info else None, gpus, price)


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
