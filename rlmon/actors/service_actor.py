"""The service as a named Ray actor: a :class:`~rlmon.service.service_core.ServiceCore` that
aggregators publish finalized steps to, and the one call Reporters make to it directly."""

from __future__ import annotations

import logging
import time
from typing import Any

from rlmon.service.aggregation.aggregator_stats import AggregatorStats
from rlmon.service.alerting.engine import AlertEvent
from rlmon.service.alerting.notify.console import ConsoleBuffer
from rlmon.service.alerting.rules import load_rules
from rlmon.service.config import Settings
from rlmon.service.contract.run_info import RunInfo
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.contract.stop_decision import StopDecision
from rlmon.service.forward.sink import ForwardSink
from rlmon.service.liveness.run_state import LivenessView
from rlmon.service.service_core import ServiceCore
from rlmon.service.spine.sinks import ExporterSink

__all__ = ["SERVICE", "send_to_service", "service_actor_class"]

SERVICE = "rlmon-service"  # the actor's name in its namespace

_log = logging.getLogger("rlmon.service")


def send_to_service(sink: Any, method: str, *args: Any) -> bool:
    """Call the service's ``method`` for a Reporter without waiting for the result.

    A sink with a method of that name (an in-process sink) gets the call directly; a Ray sink
    (one with a ``namespace``) reaches the named service actor and does not wait for the reply.
    Any other sink (``LocalSink``) has no service: nothing is sent. Returns whether it was sent;
    a failure is logged, never raised into the training loop.
    """
    hook = getattr(sink, method, None)
    try:
        if callable(hook):
            hook(*args)
            return True
        call_service = getattr(sink, "call_service", None)
        if callable(call_service):  # a RaySink: queued until its sender thread connects
            call_service(method, *args)
            return True
        namespace = getattr(sink, "namespace", None)
        if not isinstance(namespace, str):
            return False
        import ray

        getattr(ray.get_actor(SERVICE, namespace=namespace), method).remote(*args)
        return True
    except Exception as exc:  # the service is down or restarting: metadata is best effort
        _log.warning("rlmon: could not send %s to the service: %s: %s", method,
                     type(exc).__name__, exc)
        return False



def service_actor_class() -> Any:
    """The Ray actor class around :class:`ServiceCore` (defined lazily: only this imports Ray)."""
    import ray

    remote: Any = ray.remote

    @remote(num_cpus=0)
    class ServiceActor:
        def __init__(
            self, settings: Settings, state_dir: str | None, port: int | None,
            host: str | None, shards: int, rules: str | None = None, creator: str = "",
        ) -> None:
            """``settings``: resolved by the process that starts the service (its file,
            environment and flags), never again here: this worker's environment is Ray's, not
            the starter's. They arrive as this constructor's argument, pickled into the actor's
            creation task: Ray's dashboard and state API show an actor's class, resources,
            runtime_env and death cause, never its arguments, and a restart on another node
            gets the same settings. Their secrets are ``SecretStr`` (masked in any repr).
            ``port`` None: the settings' ``exporter.port``. Only the default port gives way
            to a free one when taken (said in :meth:`layout`); a port asked for (here, by
            RLMON_PORT or in the config) that is taken is an error naming it. ``creator``
            names the process that started it."""
            asked = port is not None or "port" in settings.exporter.model_fields_set
            wanted = port if port is not None else settings.exporter.port
            self.console = ConsoleBuffer()  # printed by the process that started the service
            self.core = ServiceCore(
                settings, state_dir=state_dir, port=wanted, host=host,
                rules=load_rules(rules) if rules is not None else None,
                port_fallback=not asked, transports={"console": self.console}).start()
            self.shards, self.creator, self.state_dir = shards, creator, state_dir
            self.started = time.time()

        def settings_match(self, settings: Settings) -> bool:
            """Whether ``settings`` are the ones this service runs with (secrets included)."""
            return bool(settings == self.core.settings)

        def layout(self) -> dict[str, Any]:
            core, ports = self.core, self.core.ports
            return {
                "shards": self.shards, "port": core.port, "host": ports.host,
                "wanted_port": ports.wanted_port,
                "port_moved": core.port is not None and ports.wanted_port not in (0, core.port),
                "creator": self.creator, "state_dir": self.state_dir,
                "destinations": core.dispatcher.destinations(),
                # the period its liveness judges silence by: Reporters not told theirs take it
                "heartbeat_seconds": core.settings.liveness.heartbeat_seconds,
            }

        def placement(self) -> dict[str, Any]:
            """The node this service runs on and the resources it holds there."""
            ctx = ray.get_runtime_context()
            return {"node": ctx.get_node_id(), "resources": ctx.get_assigned_resources()}

        def publish(
            self, records: list[StepRecord], shard: int = 0,
            stats: AggregatorStats | None = None,
        ) -> dict[str, StopDecision]:
            """Publish an aggregator's finalized steps; answer with the stop decisions of their
            runs (the aggregator passes them on to the runs' Reporters)."""
            return self.core.receive(records, shard, stats)

        def liveness(self, views: list[LivenessView], shard: int = 0) -> None:
            """An aggregator's liveness views (rlmon.service.liveness): alerts and /metrics."""
            self.core.liveness(views, shard)

        def recent_events(self, since: int = 0) -> tuple[int, list[AlertEvent]]:
            return self.core.recent_events(since)

        def take_console(self) -> list[str]:
            """Console alert lines not yet printed (each is handed out once)."""
            return self.console.take()

        def set_run_info(self, run: str, info: RunInfo | dict[str, Any]) -> None:
            self.core.set_run_info(run, info)

        def finish_run(self, run: str) -> None:
            self.core.finish_run(run)

        def steps(self, run: str | None = None, role: str | None = None) -> list[dict[str, Any]]:
            return self.core.history.steps(run, role)

        def alerts(self, run: str | None = None, cost: bool = False) -> list[dict[str, Any]]:
            """The alert lines; with ``cost``, also each one's cost and how a closing ended
            (HistoryStore.alerts)."""
            return self.core.history.alerts(run, cost=cost)

        def run_states(self, run: str | None = None) -> list[dict[str, Any]]:
            """Each (run, role)'s liveness state as last stored: running ... finished, failed,
            preempted, dead, with since, the last step and how it ended (docs/liveness.md)."""
            return self.core.history.liveness(run)

        def stats(self) -> dict[str, Any]:
            spine = self.core.spine
            return {
                "redeliveries": spine.memory.redeliveries,
                "ingest": spine.sinks[ExporterSink].aggregated(),  # the shards' AggregatorStats
                "dispatch": self.core.dispatcher.stats(),
                "removed": dict(spine.memory.removed),  # retention and expiry, by kind
                # per tracker: sent, dropped, failures
                "forward": spine.sinks[ForwardSink].stats(),
            }

        def healthy(self) -> tuple[bool, str]:
            return self.core.spine.commit.healthy()

        def close(self, timeout: float = 5.0) -> bool:
            return self.core.close(timeout)

    return ServiceActor
