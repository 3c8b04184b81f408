"""The whole path of a stop decision in one process, without Ray: Reporters send to an
:class:`AggregatorServer` (optionally through a :class:`NodeMerger`, forwarded on each send) that
publishes to a :class:`ServiceCore` with ``receive``, as the Ray actors do."""

from __future__ import annotations

from collections.abc import Sequence

from rlmon.service.aggregation.aggregator import AggregatorCore, AggregatorServer
from rlmon.service.aggregation.node_merge import NodeMerger
from rlmon.service.config import Settings
from rlmon.service.contract.acks import IngestAck
from rlmon.service.contract.step_message import StepMessage
from rlmon.service.service_core import ServiceCore

__all__ = ["InProcess", "stopping_settings"]


def stopping_settings(stop_runs: dict[str, list[str]] | None = None, **more: object) -> Settings:
    """Console notifier off; ``stop.runs`` from ``{run glob: [rule, ...]}``."""
    return Settings.model_validate({
        "notifiers": {"console": {"enabled": False}}, **more,
        "stop": {"runs": [{"run": glob, "rules": rules}
                          for glob, rules in (stop_runs or {}).items()]},
    })


class InProcess:
    """A Reporter sink: the aggregator tier and the service in this process."""

    def __init__(self, service: ServiceCore, node_merge: bool = False) -> None:
        self.service = service
        self.core = AggregatorCore()
        self.server = AggregatorServer(self.core, service.receive, tick_s=0.005).start()
        self.merger = NodeMerger() if node_merge else None

    def send(self, messages: Sequence[StepMessage]) -> IngestAck:
        if self.merger is None:
            return self.server.ingest(list(messages))
        accepted = sum(self.merger.add(m) for m in messages)
        self._forward()
        return self.merger.ack(messages, accepted)

    def _forward(self) -> None:
        assert self.merger is not None
        batch = self.merger.next_batch()
        if batch is not None:
            self.merger.merged(batch, self.server.merge_batch(batch))

    def probe(self, run: str, role: str) -> IngestAck:
        if self.merger is None:
            return self.core.probe(run, role)
        return self.merger.probe(run, role)

    def knows_stop(self, run: str) -> bool:
        """The aggregator holds the service's stop decision for ``run``."""
        with self.core.lock:
            return run in self.core.stops

    def close(self) -> None:
        self.server.close()
