"""The stop desk: which runs the service asks to stop (rlmon.service.contract.stop_decision).

A rule with the stop action that fires for a run the config's ``stop.runs`` lets it stop asks
the run to stop (the firing's notification says so); the decision is renewed while that alert
still holds. The newest decisions are kept in memory, all of them in the history store.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable
from dataclasses import replace

from rlmon.service.alerting.alert_types import AlertEvent
from rlmon.service.alerting.engine import AlertEngine
from rlmon.service.alerting.notify.render import summary_line
from rlmon.service.config import StopConfig
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.contract.stop_decision import STOP, StopDecision
from rlmon.service.storage.history import HistoryStore

__all__ = ["StopDesk"]

_log = logging.getLogger("rlmon.service")
_MAX_STOPS = 1_000  # stop decisions kept in memory (the newest; all are in the history store)


class StopDesk:
    """Decides stops as steps are judged; ``decisions`` (run -> the latest) and ``counts`` (by
    alert) are what the aggregators' acknowledgements and /metrics read."""

    def __init__(self, engine: AlertEngine, config: StopConfig, history: HistoryStore) -> None:
        """The newest decisions the history store holds are read back (a restarted service
        keeps answering them)."""
        self._engine, self._config = engine, config
        self._stoppers = {r.name for r in engine.rules if STOP in r.actions}
        self.decisions: dict[str, StopDecision] = {
            d.run: d for d in reversed(history.stops(limit=_MAX_STOPS))}
        self.counts: Counter[str] = Counter()
        if self._stoppers and not config.runs:
            _log.warning("rlmon: rules %s carry the stop action, but the config's stop.runs lets "
                         "them stop no run", ", ".join(sorted(self._stoppers)))
        elif config.runs and not self._stoppers:
            _log.warning("rlmon: the config's stop.runs is set, but no rule carries the stop "
                         "action (actions: [stop] in the rule file)")

    def decide(self, record: StepRecord, events: list[AlertEvent], now: float,
               decided: dict[str, StopDecision]) -> list[AlertEvent]:
        """Take or renew ``record``'s run's stop decision (into ``decided``, the batch's);
        returns ``events`` with the stop marked on the firing that asked for it."""
        if not self._stoppers:
            return events
        run = record.run
        out = []
        for event in events:
            glob = (self._config.allowed_by(run, event.alert)
                    if event.state == "firing" and event.alert in self._stoppers else None)
            if glob is not None:
                reason = summary_line(event)
                event = replace(event, stop=(
                    f"rlmon asked run {run} to stop: rule {event.alert} has the stop action and "
                    f"stop.runs {glob!r} lets it stop this run"))
                decided[run] = self._keep(StopDecision(
                    run, record.role, record.step, event.alert, reason, glob, now))
                self.counts[event.alert] += 1
                _log.warning("rlmon: %s", event.stop)
            out.append(event)
        known = self.decisions.get(run)
        if known is not None and known.at < now and known.alert in self._stoppers:
            state = self._engine.state(run, record.role, known.alert)
            if state is not None and state.firing and not state.false_steps:
                decided[run] = self._keep(replace(known, role=record.role, step=record.step,
                                                  at=now))
        return out

    def for_runs(self, runs: Iterable[str]) -> dict[str, StopDecision]:
        """The decisions taken for ``runs`` (run -> decision)."""
        return {run: self.decisions[run] for run in runs if run in self.decisions}

    def _keep(self, decision: StopDecision) -> StopDecision:
        self.decisions.pop(decision.run, None)  # insertion order is the order of decisions
        self.decisions[decision.run] = decision
        while len(self.decisions) > _MAX_STOPS:
            del self.decisions[next(iter(self.decisions))]
        return decision
