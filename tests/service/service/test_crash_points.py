"""Every alert transition reaches its receiver exactly once, whatever commit point of a step the
service process is SIGKILLed at.

Real processes: each scenario runs tests/service_crash_child.py (a real ServiceCore with its
history store and outbox on disk, real slack-sdk or webhook notifier) with ``RLMON_CRASH_AT``
naming a commit point (rlmon.service.crash_points), so it kills itself there, deterministically.
Then the same state directory is served again by a fresh process, which receives the
aggregator's redelivery of every step and shuts down at once (a graceful drain with rows
pending). A loopback receiver that takes
0.3 s to answer counts what arrived. All scenarios run side by side (two process waves), so the
module costs seconds.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from rlmon.service.crash_points import CRASH_AT, POINTS
from tests.support.alerting_support import Receiver
from tests.support.paths import SUPPORT
from tests.support.service_crash_child import TRANSITIONS

CHILD = SUPPORT / "service_crash_child.py"
DESTINATIONS = ("slack", "webhook")
SLOW_RECEIVER = 0.3  # seconds per answer: deliveries are in flight when the service stops
_SLACK_HEADER = re.compile(r"(firing|resolved) on \S+ / \S+, step (\d+)")


@dataclass(frozen=True, slots=True)
class Outcome:
    first_exit: int  # the crashed process (-9: killed at the point)
    restart_exit: int
    arrived: Counter[tuple[str, str]]  # (step, state) -> deliveries the receiver accepted
    output: str


def _transitions(destination: str, body: object) -> list[tuple[str, str]]:
    assert isinstance(body, dict)
    if destination == "webhook":
        return [(str(a["step"]), a["state"]) for a in body["alerts"]]
    header = body["blocks"][0]["text"]["text"]
    found = _SLACK_HEADER.search(header)
    assert found is not None, header
    return [(found.group(2), found.group(1))]


def _env(receiver: Receiver, destination: str, tag: str, crash_at: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLMON_")}
    if destination == "slack":
        env["RLMON_SLACK_WEBHOOK_URL"] = f"{receiver.url}/slack/{tag}"
        env["RLMON_NOTIFIERS__SLACK__MIN_INTERVAL_SECONDS"] = "0"
    else:
        env["RLMON_NOTIFIERS__WEBHOOK__URL"] = f"{receiver.url}/hook/{tag}"
    # each step's transitions as one message, counted per step (a group's members survive a
    # crash as every notification does: test_notify_grouping's restart test)
    env["RLMON_NOTIFIERS__GROUPING__ENABLED"] = "false"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(CHILD.parent),
                                                      env.get("PYTHONPATH")]))
    if crash_at is not None:
        env[CRASH_AT] = crash_at
    return env


def _wave(receiver: Receiver, root: Path, crashing: bool) -> dict[tuple[str, str], tuple[int, str]]:
    procs = {}
    for point in POINTS:
        for dest in DESTINATIONS:
            tag = f"{point}-{dest}"
            state = root / tag
            # the delivery threads must get to the row first, except when the drain should
            mode = "live" if crashing and point != "drain.sending" else "stop"
            procs[(point, dest)] = subprocess.Popen(
                [sys.executable, str(CHILD), str(state), dest, mode],
                env=_env(receiver, dest, tag, point if crashing else None),
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = {}
    for key, proc in procs.items():
        text, _ = proc.communicate(timeout=120)
        out[key] = (proc.returncode, text)
    return out


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[tuple[str, str], Outcome]]:
    root = tmp_path_factory.mktemp("crash")
    receiver = Receiver(delay=SLOW_RECEIVER).start()
    try:
        crashed = _wave(receiver, root, crashing=True)
        restarted = _wave(receiver, root, crashing=False)
        results = {}
        for (point, dest), (first, first_out) in crashed.items():
            tag = f"{point}-{dest}"
            prefix = f"/slack/{tag}" if dest == "slack" else f"/hook/{tag}"
            arrived: Counter[tuple[str, str]] = Counter()
            for request in receiver.accepted(prefix):
                arrived.update(_transitions(dest, request.body))
            second, second_out = restarted[(point, dest)]
            results[(point, dest)] = Outcome(first, second, arrived, first_out + second_out)
        yield results
    finally:
        receiver.stop()


@pytest.mark.parametrize("destination", DESTINATIONS)
@pytest.mark.parametrize("point", POINTS)
def test_every_transition_arrives_exactly_once(
    outcomes: dict[tuple[str, str], Outcome], point: str, destination: str,
) -> None:
    result = outcomes[(point, destination)]
    assert result.first_exit == -9, f"not killed at {point}:\n{result.output}"
    assert result.restart_exit == 0, f"the restarted service did not drain:\n{result.output}"
    per_transition = {t: result.arrived.get(t, 0) for t in TRANSITIONS}
    assert per_transition == dict.fromkeys(TRANSITIONS, 1), (
        f"{destination}, killed at {point}: deliveries per (step, state) {per_transition}")
