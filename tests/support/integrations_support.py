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
