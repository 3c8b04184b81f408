"""A training script that ends one way or another (argv[1]), its Reporter's heartbeats written to
argv[2] as JSON lines, each checked as the aggregator checks it (tests of how a process ends).
Failures are raised inside spans: the closing heartbeat names the spans open where it failed."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import sys
import threading
from collections.abc import Sequence

from rlmon.actors.reporter import Reporter, outcome
from rlmon.actors.reporter.sink import LocalSink
from rlmon.service.contract.acks import IngestAck
from rlmon.service.contract.heartbeat import Heartbeat, check_heartbeat
from rlmon.service.contract.step_message import StepMessage


class FileBeatSink(LocalSink):
    """A local sink writing every heartbeat, as the aggregator would accept it, to a file."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def _write(self, beats: Sequence[Heartbeat]) -> None:
        with open(self.path, "a", encoding="utf-8") as fh:
            for beat in beats:
                fh.write(json.dumps(dataclasses.asdict(check_heartbeat(beat))) + "\n")

    def send(self, messages: Sequence[StepMessage]) -> IngestAck:
        self._write([m.heartbeat for m in messages if m.heartbeat is not None])
        return super().send(messages)

    def heartbeat(self, beats: Sequence[Heartbeat]) -> None:
        self._write(beats)


def user_hook(kind: type[BaseException], value: BaseException, tb: object) -> None:
    print(f"user hook saw {kind.__name__}: {value}", flush=True)


def exit_on_sigterm(signum: int, frame: object) -> None:
    sys.exit(signum)  # what Ray's handler does in a driver that called ray.init itself


def main(scenario: str, path: str) -> None:
    sys.excepthook = user_hook  # the user's own hook, set before rlmon's: it must still run
    if scenario == "sigterm_to_exit":
        signal.signal(signal.SIGTERM, exit_on_sigterm)
    rep = Reporter("ends", "actor", rank={"dp": 0}, world={"dp": 1}, sink=FileBeatSink(path),
                   hardware_interval=None, heartbeat_seconds=0.05)
    outcome.install()  # a second install (another Reporter, the runtime) chains nothing twice
    if scenario == "load_crash":  # before any step: the stage alone made the rank known
        with rep.span("load_model"):
            raise OSError("model.safetensors: No such file or directory")
    for step in range(3):
        rep.record("actor/loss", sum=1.0, count=1.0)
        rep.end_step(step)
    assert rep.flush(30), rep.last_error
    if scenario == "uncaught":
        with rep.span("update_actor"), rep.span("backward"):
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
    if scenario == "with_block":
        with rep, rep.span("weight_sync"):
            raise RuntimeError("NCCL error: unhandled system error")
    if scenario == "finally":
        try:
            with rep.span("reward"):
                raise ValueError("bad batch")
        finally:
            rep.close()
    if scenario == "caught_then_uncaught":
        with contextlib.suppress(ValueError), rep.span("rollout"):
            raise ValueError("a retried batch")  # caught: not where the process ends
        raise RuntimeError("a late failure")
    if scenario == "thread":
        def train() -> None:
            rep.end_step(3)  # this thread is the rank's training thread now
            raise KeyError("reward")
        worker = threading.Thread(target=train)
        worker.start()
        worker.join()
        rep.close()  # the main thread closes cleanly: the rank still died of its exception
    if scenario == "exit3":
        sys.exit(3)
    if scenario == "exit_caught":
        with contextlib.suppress(SystemExit):
            sys.exit(4)
        rep.end_step(3)  # the run went on: the caught exit is not how it ended
    if scenario in ("sigterm", "sigterm_to_exit"):
        print("ready", flush=True)
        with rep.span("generate"):
            os.kill(os.getpid(), signal.SIGTERM)
            signal.pause()
    if scenario == "clean":
        rep.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
