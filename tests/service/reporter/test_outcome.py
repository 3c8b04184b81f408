"""How a process ends reaches its Reporter's closing heartbeat (issue 29): an uncaught exception
(the user's own excepthook still runs), a with-block or a ``finally`` left by one, a training
thread's exception, ``sys.exit(3)`` (and a caught one that is not the end), SIGTERM (the process
still dies of it) and a clean close; with the spans open where each failed. Each scenario is a
real process (tests/support/outcome_child.py) whose heartbeats are written as the aggregator's
edge check accepts them."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from typing import Any

import pytest

from rlmon.actors.reporter import outcome
from rlmon.service.contract.heartbeat import MAX_OUTCOME_MESSAGE, OutcomeKind
from tests.support.paths import REPO

CHILD = REPO / "tests" / "support" / "outcome_child.py"

# scenario: (exit status, outcome kind or None for clean, exc_type, message, exit code, signal)
SCENARIOS: dict[str, tuple[int, str | None, str, str, int | None, str]] = {
    "uncaught": (1, "exception", "RuntimeError", "CUDA out of memory. Tried to allocate 2.00 GiB",
                 None, ""),
    "with_block": (1, "exception", "RuntimeError", "NCCL error: unhandled system error", None, ""),
    "finally": (1, "exception", "ValueError", "bad batch", None, ""),
    "thread": (0, "exception", "KeyError", "'reward'", None, ""),
    "exit3": (3, "exit", "SystemExit", "3", 3, ""),
    "load_crash": (1, "exception", "OSError", "model.safetensors: No such file or directory",
                   None, ""),
    "caught_then_uncaught": (1, "exception", "RuntimeError", "a late failure", None, ""),
    "exit_caught": (0, None, "", "", None, ""),
    "sigterm": (-signal.SIGTERM, "signal", "", "", None, "SIGTERM"),
    # a SIGTERM handler of the user's (Ray's, in a driver that called ray.init) turns it into
    # sys.exit(15): still a SIGTERM, in the span the exit left
    "sigterm_to_exit": (signal.SIGTERM, "signal", "", "", None, "SIGTERM"),
    "clean": (0, None, "", "", None, ""),
}

# the spans the closing heartbeat names: those open where the failure was raised (unwound by the
# time the Reporter closes), or at the signal; none for a failure outside any span
STAGES: dict[str, list[str]] = {"uncaught": ["update_actor", "backward"],
                                "with_block": ["weight_sync"], "finally": ["reward"],
                                "sigterm": ["generate"], "sigterm_to_exit": ["generate"],
                                "load_crash": ["load_model"]}


@pytest.fixture(scope="module")
def ended(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, str, list[Any]]]:
    """Every scenario's exit status, output and heartbeats (run side by side: one wait)."""
    root = tmp_path_factory.mktemp("outcome")
    procs = {name: subprocess.Popen([sys.executable, str(CHILD), name, str(root / name)],
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for name in SCENARIOS}
    out = {}
    for name, proc in procs.items():
        text, _ = proc.communicate(timeout=240)
        path = root / name
        beats = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        out[name] = (proc.returncode, text, beats)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_the_closing_heartbeat_says_how_the_process_ended(
        ended: dict[str, tuple[int, str, list[Any]]], scenario: str) -> None:
    status, kind, exc_type, message, code, sig = SCENARIOS[scenario]
    returncode, text, beats = ended[scenario]
    assert returncode == status, text[-3000:]
    closing = [b for b in beats if b["closing"]]
    assert len(closing) == 1 and beats[-1]["closing"], (beats[-3:], text[-3000:])
    assert all(b["outcome"] is None for b in beats[:-1])  # said only on the closing one
    said = closing[0]["outcome"]
    if kind is None:
        assert said is None, said
    else:
        assert said is not None, text[-3000:]
        assert (said["kind"], said["exc_type"], said["message"], said["exit_code"],
                said["signal"]) == (kind, exc_type, message, code, sig)
    if kind == "exception":  # the last frames, innermost last, in the script
        assert said["frames"] and "outcome_child.py:" in said["frames"][-1], said["frames"]
    spans = [s["name"] for r in closing[0]["ranks"] for s in r["spans"]]
    assert spans == STAGES.get(scenario, []), spans
    process = closing[0]["process"]
    assert process["pid"] > 0 and process["hostname"], process
    assert all(b["process"] == process for b in beats)  # on every heartbeat


def test_a_users_excepthook_still_runs(ended: dict[str, tuple[int, str, list[Any]]]) -> None:
    for scenario in ("uncaught", "with_block", "finally"):
        _returncode, text, _ = ended[scenario]
        assert f"user hook saw {SCENARIOS[scenario][2]}: {SCENARIOS[scenario][3]}" in text, text
        assert text.count("user hook saw") == 1, text  # chained once, however often installed


def _raise(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:
        return caught


def test_an_exception_is_described_by_its_qualified_type_message_and_last_frames() -> None:
    said = outcome.describe(_raise(subprocess.TimeoutExpired("cmd", 1.0)))
    assert said is not None and said.kind is OutcomeKind.EXCEPTION
    assert said.exc_type == "subprocess.TimeoutExpired"
    assert said.message == "Command 'cmd' timed out after 1.0 seconds"
    assert said.frames[-1].endswith(" in _raise") and "test_outcome.py:" in said.frames[-1]
    long = outcome.describe(_raise(ValueError("x" * 5000)))
    assert long is not None and len(long.message) == MAX_OUTCOME_MESSAGE


def test_exits_and_interrupts_are_described_by_their_code_and_signal() -> None:
    assert outcome.describe(SystemExit(0)) is None
    assert outcome.describe(SystemExit(None)) is None
    three = outcome.describe(SystemExit(3))
    assert three is not None and (three.kind, three.exit_code) == (OutcomeKind.EXIT, 3)
    text = outcome.describe(SystemExit("bad config"))  # printed, status 1
    assert text is not None and (text.exit_code, text.message) == (1, "bad config")
    interrupted = outcome.describe(KeyboardInterrupt())
    assert interrupted is not None
    assert (interrupted.kind, interrupted.signal) == (OutcomeKind.SIGNAL, "SIGINT")


def test_a_ray_task_error_carries_the_actors_exception() -> None:
    """The RayTaskError ray.get raises in a driver, built as Ray builds it from the actor's
    exception: the type names both, the message and frames are the actor's."""
    from ray.exceptions import RayTaskError

    cause = _raise(ValueError("reward model returned NaN"))
    remote = ('Traceback (most recent call last):\n  File "/job/rank.py", line 12, in train\n'
              '    raise ValueError("reward model returned NaN")\nValueError: reward model '
              'returned NaN')
    error = RayTaskError("Rank.train", remote, cause).as_instanceof_cause()
    said = outcome.describe(_raise(error))
    assert said is not None and said.kind is OutcomeKind.EXCEPTION
    assert said.exc_type == "ray.exceptions.RayTaskError(ValueError)"
    assert said.message == "reward model returned NaN"
    assert said.frames == ("/job/rank.py:12 in train",)


def test_the_process_is_named_by_host_and_pid_without_ray() -> None:
    import os
    import socket

    me = outcome.process_id()
    assert (me.hostname, me.pid) == (socket.gethostname(), os.getpid())
