"""Shared by the framework-integration tests: real Reporters feeding an in-process assembler."""

from __future__ import annotations

from typing import Any

from rlmon.actors.reporter import LocalSink, Reporter
from rlmon.service.step import StepRecord


class Hub:
    """Reporters of one test share one LocalSink; ``records()`` flushes them and returns steps."""

    def __init__(self) -> None:
        self.sink = LocalSink()
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
