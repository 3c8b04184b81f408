"""The stop switch: the decision the service publishes when a rule asks a run to stop.

Stopping is opt-in twice, so that no run stops by accident: the rule carries the stop action
(``actions: [stop]`` in the rule file, :class:`~rlmon.service.alerting.rules.Rule`) *and* the service's
config lets that rule stop runs matching a glob (``stop.runs``,
:class:`~rlmon.service.config.StopConfig`). When such a rule fires for such a run, the service
records a :class:`StopDecision` (kept in the history store) and hands it back to the aggregators,
which pass it on in the acknowledgements Reporters already receive; ``Reporter.should_stop()``
reads it without waiting and the integrations stop the trainer their framework's way.

A decision applies to the Reporters that were running when it was taken: one started later (the
run resumed or rerun after someone looked) is not asked to stop by it. While the alert keeps
firing and its condition still holds, each new step renews the decision, so a process resumed
with the fault still there is asked to stop again.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["STOP", "StopDecision"]

STOP = "stop"  # the action's name in rule files


@dataclass(frozen=True, slots=True)
class StopDecision:
    """The service asked ``run`` to stop: which alert, at which step, why, and when (unix
    seconds, the service's clock; renewed while the alert holds)."""

    #: The run asked to stop.
    run: str
    #: The role whose step fired the alert.
    role: str
    #: The step that fired it (or last renewed the decision).
    step: int
    #: The alert rule's name.
    alert: str
    #: The alert's line: what fired, the value and the condition.
    reason: str
    #: The config's run glob (``stop.runs``) that lets the rule stop this run.
    allowed_by: str
    #: Unix seconds (the service's clock) when the decision was taken or last renewed.
    at: float

    def applies_to(self, started: float) -> bool:
        """Whether a Reporter started at ``started`` (unix seconds) was running when the decision
        was last taken or renewed."""
        return self.at >= started

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StopDecision:
        return cls(**data)
