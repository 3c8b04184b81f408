"""A Reporter sink straight into an in-process aggregator: the aggregator actor without Ray."""

from __future__ import annotations

from collections.abc import Sequence

from rlmon.service.aggregation.aggregator import AggregatorCore
from rlmon.service.contract.acks import IngestAck
from rlmon.service.contract.step_message import StepMessage

__all__ = ["AggregatorSink"]


class AggregatorSink:
    """Sends and probes go to ``core`` as the actor's ``ingest`` and ``probe`` would; assign a
    new core to ``core`` to restart the aggregator under the Reporters' feet."""

    def __init__(self, core: AggregatorCore) -> None:
        self.core = core

    def send(self, messages: Sequence[StepMessage]) -> IngestAck:
        return self.core.ingest(list(messages))

    def probe(self, run: str, role: str) -> IngestAck:
        return self.core.probe(run, role)
