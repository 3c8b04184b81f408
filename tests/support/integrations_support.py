"""Shared by the framework-integration tests: real Reporters feeding an in-process assembler."""

from __future__ import annotations

from typing import Any

from rlmon.actors.reporter import Reporter
from rlmon.actors.reporter.sink import LocalSink
from rlmon.service.contract.step_record import StepRecord


class InfoSink(LocalSink):
    """A LocalSink that also takes the service's run-metadata call, as an in-process sink does."""

    def __init__(self) -> None:
        super().__init__()
        self.run_info: dict[str, Any] = {}

    def set_run_info(self, run: str, info: Any) -> None:
        self.run_info[run] = info


class Hub:
    """Reporters of one test share one LocalSink; ``records()`` flushes them and returns steps.
    ``run_info[run]`` holds the last ``Reporter.set_run_info`` of a run."""

    def __init__(self) -> None:
        self.sink = InfoSink()
        self.run_info = self.sink.run_info
        self.reporters: list[Reporter] = []

    def reporter(self, run: str = "run", role: str = "driver", **kw: Any) -> Reporter:
        kw.setdefault("rank", {})
        kw.setdefault("world", {})
        rep = Reporter(run, role, sink=self.sink, start_service=False, step_seconds=False, **kw)
        self.reporters.append(rep)
        return rep

    def factory(self, run: str, role: str, **kw: Any) -> Reporter:
        return self.reporter(run, role, **kw)

    def records(self, *, finalize: bool = False) -> list[StepRecord]:
        for rep in self.reporters:
            assert rep.flush(10.0), rep.last_error
        if finalize:
            self.sink.finalize_all()
        return list(self.sink.records)

    def step(self, role: str, step: int) -> StepRecord:
        found = [r for r in self.records() if r.role == role and r.step == step]
        assert len(found) == 1, [(r.role, r.step) for r in self.records()]
        return found[0]

    def close(self) -> None:
        for rep in self.reporters:
            rep.close()


class _CoreSink(InfoSink):
    """Steps and heartbeats into a real aggregator core (one lock: the core is one actor)."""

    def __init__(self, core: Any, lock: Any) -> None:
        super().__init__()
        self.core, self.lock = core, lock

    def send(self, messages: Any) -> Any:
        with self.lock:
            return self.core.ingest(list(messages))

    def heartbeat(self, beats: Any) -> Any:
        with self.lock:
            return self.core.heartbeat(list(beats))


class ServiceHub(Hub):
    """Reporters of one test reaching a real aggregator core and service, liveness included, on
    a simulated clock: :meth:`pages_after` moves it past every threshold and returns what
    paged. The integration tests' "a clean end pages nothing" (and, left unclosed, RunDied)."""

    def __init__(self, tmp: Any) -> None:
        import threading
        import time

        from rlmon.service.aggregation.aggregator import AggregatorCore
        from rlmon.service.aggregation.watermark import WatermarkStore
        from rlmon.service.config import Settings
        from rlmon.service.service_core import ServiceCore
        from tests.unit.liveness.support import sim_clock

        super().__init__()
        self.clock = sim_clock(time.time())
        self.lock = threading.Lock()
        self.core = AggregatorCore(store=WatermarkStore(tmp / "w.sqlite"), clock=self.clock,
                                   wall_clock=self.clock.wall)
        self.service = ServiceCore(
            Settings.model_validate({"notifiers": {"console": {"enabled": False}},
                                     "exporter": {"port": 0}}),
            state_dir=tmp / "state", clock=self.clock)
        self.sink = _CoreSink(self.core, self.lock)
        self.run_info = self.sink.run_info

    def reporter(self, run: str = "run", role: str = "driver", **kw: Any) -> Reporter:
        kw.setdefault("heartbeat_seconds", 0.05)
        return super().reporter(run, role, **kw)

    def pages_after(self, seconds: float) -> list[tuple[str, str, str, str]]:
        """(run, role, alert, state) of every alert transition from now until ``seconds`` of
        silence later, every Reporter's messages delivered first."""
        for rep in self.reporters:
            rep.flush(10.0)
        events = []
        for _ in range(int(seconds)):
            self.clock.advance(1.0)
            with self.lock:
                self.core.tick()
                records = self.core.pending_records(10_000)
                if records:
                    events += self.service.publish(records)
                    self.core.delivered(records)
                events += self.service.liveness(self.core.take_views())
        return [(e.run, e.role, e.alert, e.state) for e in events]

    def states(self) -> dict[tuple[str, str], str]:
        return {(r["run"], r["role"]): r["state"] for r in self.service.history.liveness()}

    def close(self) -> None:
        super().close()
        self.service.close(0.0)
