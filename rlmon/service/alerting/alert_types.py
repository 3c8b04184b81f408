"""What the alert engine emits and keeps per (run, role, alert): :class:`AlertEvent` and
:class:`AlertState`.

A bottom-layer module: the history store, the notifiers, the exporter and the cost accounting
import these without importing the engine (:mod:`rlmon.service.alerting.engine` owns the states
and re-exports both names).
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from rlmon.service.contract.step_record import json_number

if TYPE_CHECKING:
    from rlmon.service.alerting.baseline_batch import SeriesPredictions
    from rlmon.service.alerting.level_shift import Shift

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
    # the engine's notification policy: the severity a warning escalated from (this event is
    # the escalation, at the new severity), a re-send of a still-firing critical alert (not a
    # transition: not stored as one), and False where the per-hour bound held it back (stored,
    # not sent)
    escalated_from: str = ""
    repeat: bool = False
    notify: bool = True
    # a resolve because the rule's level rule fires now and judges the level reached (an early
    # warning handed over to its fixed rule: EntropySliding to EntropyCollapse): that rule's name
    handed_to: str = ""
    # a resolve that only says the run ended with the alert firing (rlmon.service.alerting.
    # run_end): the run is over, not the condition
    ended_with_run: bool = False

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
    """One (run, role, alert)'s state machine, owned by the engine and saved with each step."""

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
    # while firing: its severity now (a warning may escalate), and for a baseline rule the
    # level before the onset (expected, scale; in the detector's space) it is judged against
    severity: str = ""
    reference: tuple[float, float] | None = None
    # the notifications of the last hour (unix seconds; the per-hour bound), and whether the
    # firing was held back (its resolve is then held back too)
    sent: deque[float] = field(default_factory=deque)
    held: bool = False
    # baseline: the predictions of a batch evaluated in order (not saved; never needed to
    # continue: the detector predicts itself without them)
    ahead: SeriesPredictions | None = field(default=None, compare=False, repr=False)
    # baseline: the level shift a firing is held back by (rlmon.service.alerting.level_shift),
    # and while firing the steps (earliest, latest) its stated heading put the level at
    # (rlmon.service.alerting.heading); saved together (claims_json)
    shift: Shift | None = None
    stated: tuple[int, int] | None = None
    # a warning past its fixed critical bound: the first of the consecutive steps it has been
    # there (one that jumped there from quiet is critical on the second:
    # rlmon.service.alerting.engine); saved with the claims
    critical_since: int | None = None

    def claims_json(self) -> str | None:
        """The shift, the stated heading and the critical level's first step as JSON for the
        history store (None: none of them)."""
        if self.shift is None and self.stated is None and self.critical_since is None:
            return None
        return json.dumps({"shift": None if self.shift is None else self.shift.to_json(),
                           "stated": None if self.stated is None else list(self.stated),
                           "critical_since": self.critical_since})

    def load_claims(self, text: str | None) -> None:
        """Restore what :meth:`claims_json` saved (None or "": none of them)."""
        from rlmon.service.alerting.level_shift import Shift  # a bottom layer: imported late

        data = json.loads(text) if text else {}
        shift, stated = data.get("shift"), data.get("stated")
        self.shift = None if shift is None else Shift.from_json(shift)
        self.stated = None if stated is None else (int(stated[0]), int(stated[1]))
        since = data.get("critical_since")
        self.critical_since = None if since is None else int(since)
