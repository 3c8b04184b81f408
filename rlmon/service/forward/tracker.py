"""What a tracker is given, and the names it logs values under.

A :class:`Tracker` is one destination (W&B, MLflow, TensorBoard). Its methods are called from the
tracker's own forwarding thread only, may block and may raise: the sink retries a call that
raised, with backoff, and counts it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Literal, Protocol

from rlmon.service.alerting.alert_types import AlertEvent
from rlmon.service.metrics import keymaps

__all__ = ["EndState", "ForwardedStep", "Tracker", "TrackerRun", "metric_key", "step_key"]

EndState = Literal["finished", "failed", "preempted"]


@dataclass(frozen=True, slots=True)
class TrackerRun:
    """One tracker run: an rlmon run's attempt (a rerun under the same name is a run of its
    own). ``id`` is safe as a W&B run id, an MLflow tag value and a directory name."""

    run: str
    attempt: int = 0

    @property
    def name(self) -> str:
        return self.run if not self.attempt else f"{self.run}#{self.attempt}"

    @property
    def id(self) -> str:
        safe = re.sub(r"[^A-Za-z0-9_-]", "-", self.run)[:96]
        if safe != self.run:  # two names that differ only in . and : stay two runs
            safe += "-" + hashlib.sha1(self.run.encode()).hexdigest()[:8]
        return safe if not self.attempt else f"{safe}-attempt{self.attempt}"


@dataclass(frozen=True, slots=True)
class ForwardedStep:
    """One finalized step of one role, as logged: ``values`` under the tracker names."""

    role: str
    step: int
    time: float  # unix seconds of its finalization
    values: Mapping[str, float]


class Tracker(Protocol):
    name: str

    def log(self, run: TrackerRun, settings: Mapping[str, str],
            steps: Sequence[ForwardedStep]) -> None:
        """Log steps (opening the tracker run with ``settings`` when it is not open)."""
        ...

    def alerts(self, run: TrackerRun, settings: Mapping[str, str],
               events: Sequence[AlertEvent]) -> None: ...

    def settings(self, run: TrackerRun, settings: Mapping[str, str]) -> None: ...

    def end(self, run: TrackerRun, state: EndState) -> None:
        """The run ended: record how, and close the tracker run."""
        ...

    def release(self, run: TrackerRun) -> None:
        """Close the tracker run without an end (too many open, or the service stopping);
        a later call opens it again."""
        ...


def step_key(role: str) -> str:
    """The key a role's step is logged under where the tracker needs one (W&B)."""
    return f"rlmon_step/{role}"


@cache
def _framework_keys(framework: str) -> Mapping[str, str]:
    """catalog name -> the framework's own key for it (the first in the key map): the name the
    team's panels already use, now holding rlmon's exact value."""
    out: dict[str, str] = {}
    if framework not in keymaps.FRAMEWORKS:
        return out
    for row in keymaps.mappings(framework):
        if row.canonical:
            out.setdefault(row.canonical, row.key)
    return out


def metric_key(role: str, metric: str, framework: str = "",
               names: Literal["catalog", "framework"] = "catalog") -> str:
    """The tracker's name for a role's metric: the catalog's name (``actor/kl``), or with
    ``names="framework"`` the run's framework's own key where the key map has one; prefixed by
    the role unless it already starts with it (``rollout`` reporting ``perf/step_seconds``
    logs ``rollout/perf/step_seconds``), so two roles never share a name."""
    name = _framework_keys(framework).get(metric, metric) if names == "framework" else metric
    return name if name.startswith(role + "/") else f"{role}/{name}"
