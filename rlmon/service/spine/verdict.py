"""What the service made of one batch: the one value every stage after the judge reads.

A batch is an aggregator's finalized steps (``publish``) or its liveness views (``liveness``);
the judge turns it into a :class:`Verdict`, and the commit, the sinks and the stream memory read
that verdict and nothing else of the batch (docs/design.md, "The spine").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

from rlmon.service.aggregation.aggregator_stats import AggregatorStats
from rlmon.service.alerting.alert_types import AlertEvent, AlertState
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.contract.stop_decision import StopDecision
from rlmon.service.liveness.run_state import LivenessView

__all__ = ["JudgedStep", "Sighting", "Verdict"]

Stream = tuple[str, str]  # (run, role)
# (when the transitions were decided, the transitions): notification latency counts from then
Outbound = tuple[float | None, list[AlertEvent]]


@dataclass(frozen=True, slots=True)
class JudgedStep:
    """A step not stored before, with its alert transitions."""

    record: StepRecord
    events: tuple[AlertEvent, ...] = ()  # stored and notified
    restored: tuple[AlertEvent, ...] = ()  # firing before a restart: shown again, not stored


@dataclass(frozen=True, slots=True)
class Sighting:
    """A liveness view with the time-based transitions it made."""

    view: LivenessView
    events: tuple[AlertEvent, ...] = ()
    firing: Mapping[str, str] = field(default_factory=dict)  # the stream's liveness alerts now


@dataclass(frozen=True)
class Verdict:
    """One batch, judged. ``states`` and ``last_steps`` are the engine's after the batch, for
    the streams it touched (the commit stores them in the same transaction as the steps). The
    views of it below are computed once (a frozen value: they never change)."""

    kind: Literal["steps", "liveness"]
    at: float  # the service's clock when the batch was judged
    shard: int = 0
    stats: AggregatorStats | None = None  # the sending aggregator's counters (steps only)
    steps: tuple[JudgedStep, ...] = ()
    sightings: tuple[Sighting, ...] = ()
    stops: tuple[StopDecision, ...] = ()  # stop decisions taken or renewed
    states: Mapping[tuple[str, str, str], AlertState] = field(default_factory=dict)
    last_steps: Mapping[Stream, int] = field(default_factory=dict)

    @cached_property
    def records(self) -> tuple[StepRecord, ...]:
        return tuple(s.record for s in self.steps)

    @cached_property
    def views(self) -> tuple[LivenessView, ...]:
        return tuple(s.view for s in self.sightings)

    @cached_property
    def events(self) -> list[AlertEvent]:
        """Every transition, in the order it was decided."""
        return ([e for s in self.steps for e in s.events]
                + [e for s in self.sightings for e in s.events])

    @cached_property
    def outbound(self) -> list[Outbound]:
        """The notifications the transitions owe, by when they were decided."""
        return ([(s.record.finalized_at, list(s.events)) for s in self.steps if s.events]
                + [(s.view.at, list(s.events)) for s in self.sightings if s.events])
