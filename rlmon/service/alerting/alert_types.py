"""What the alert engine emits and keeps per (run, role, alert): :class:`AlertEvent` and
:class:`AlertState`.

A bottom-layer module: the history store, the notifiers, the exporter and the cost accounting
import these without importing the engine (:mod:`rlmon.service.alerting.engine` owns the states
and re-exports both names).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from rlmon.service.contract.step_record import json_number

if TYPE_CHECKING:
    from rlmon.service.alerting.baseline_batch import SeriesPredictions

__all__ = ["AlertEvent", "AlertState", "State"]

State = Literal["firing", "resolved"]


@dataclass(frozen=True, slots=True)
class AlertEvent:
    """An alert changed state at one step."""

    run: str
    role: str
    step: int
    alert: str
    severity: str
    state: State
    metric: str
    value: float | None
    summary: str = ""
    condition: str = ""
    what_to_check: str = ""
    # set by the service when this firing asked the run to stop: the rule and the run glob that
    # allowed it (rlmon.service.contract.stop_decision)
    stop: str = ""
    attempt: int = 0  # the run's attempt (restart count) the step belongs to
    detail: str = ""  # what the step itself says (StragglerRank: the slow rank and its span)
    # set by the service on a firing whose metric has a sample metric (catalog MetricSpec
    # .samples) that the step holds: its first few items, payloads cut (rlmon.service.storage.stored_samples)
    samples_metric: str = ""
    samples: tuple[tuple[float, str, str], ...] = ()
    # set by the service: what the condition has cost since its onset (unix seconds), on the
    # run's GPUs (rlmon.service.goodput.cost); cost_note says it in words
    onset: float | None = None
    gpus: float = 0.0
    gpu_hours: float | None = None
    money: float | None = None
    cost_note: str = ""
    # set by the service: the run's framework (RunInfo.framework, else the relayed names'
    # prefix) that picks the configuration keys of what to change
    # (rlmon.service.metrics.remedies), and which related metric left its baseline first
    # before the onset (rlmon.service.alerting.first_mover)
    framework: str = ""
    first_moved: str = ""

    @property
    def dedup_key(self) -> str:
        """One incident per (run, role, alert): a resolve closes what the trigger opened."""
        return f"{self.run}/{self.role}/{self.alert}"

    def to_json(self) -> dict[str, Any]:
        return {
            "type": "alert",
            "run": self.run,
            "role": self.role,
            "step": self.step,
            "alert": self.alert,
            "severity": self.severity,
            "state": self.state,
            "metric": self.metric,
            "value": json_number(self.value),
        }


@dataclass(slots=True)
class AlertState:
    true_steps: int = 0
    false_steps: int = 0
    firing: bool = False
    since_step: int | None = None
    metric: str = ""  # the metric that made it fire, named again when it resolves
    history: deque[float] = field(default_factory=deque)  # stuck/trend/baseline: recent values
    score: float = 0.0  # baseline: the CUSUM evidence (rlmon.service.alerting.baseline)
    # the condition's onset (unix seconds) and the run's GPUs then, saved with the state so a
    # restarted service keeps counting the alert's cost (rlmon.service.goodput.alert_costs)
    onset: float | None = None
    gpus: float = 0.0
    # baseline: the predictions of a batch evaluated in order (not saved; never needed to
    # continue: the detector predicts itself without them)
    ahead: SeriesPredictions | None = field(default=None, compare=False, repr=False)
