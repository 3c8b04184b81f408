"""A script rlmon starts Ray for never outlives its exit budget (issue 23, defect a).

A dead ``ray start`` cluster leaves its address in Ray's current-cluster file; Ray's default
joins it and retries for ever, and the script never exited. rlmon starts a Ray of its own unless
``RAY_ADDRESS`` (or an explicit address) names one, and a named Ray it cannot reach is said once,
in rlmon's words, without holding the process past ``RLMON_EXIT_TIMEOUT``.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.network import free_port
from tests.support.polling import CHILD_RUN_S
from tests.support.subprocesses import run_in_own_session

pytestmark = pytest.mark.ray

SCRIPT = """
from rlmon import Reporter
rep = Reporter(run="stale-address", role="actor")
for step in range(5):
    rep.record("actor/loss", sum=1.0, count=1.0)
    rep.end_step(step)
print("loop done", flush=True)
print("flushed", rep.flush(10), flush=True)
rep.close()
print("closed", flush=True)
"""


@pytest.fixture
def ray_tmp() -> Iterator[Path]:
    """A Ray temp dir of the test's own (short: Ray's socket paths are length-limited) holding
    a current-cluster file that names a dead cluster."""
    path = Path(tempfile.mkdtemp(prefix="rs-", dir="/tmp"))
    (path / "ray").mkdir()
    (path / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{free_port()}\n")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _env(ray_tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLMON_", "RAY_ADDRESS"))}
    env.update(RAY_TMPDIR=str(ray_tmp / "ray"), RLMON_STATE_DIR=str(ray_tmp / "state"),
               RLMON_PORT="0", RAY_DISABLE_USAGE_STATS="1", RAY_AUTH_MODE="disabled", **extra)
    return env


def test_a_stale_current_cluster_file_is_ignored(ray_tmp: Path, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = _env(ray_tmp, RLMON_EXIT_TIMEOUT="60")
    env["RAY_TMPDIR"] = str(ray_tmp)  # Ray reads <RAY_TMPDIR>/ray/ray_current_cluster
    done = run_in_own_session([sys.executable, str(script)], timeout=CHILD_RUN_S, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Connecting to existing Ray cluster" not in done.stderr
    assert "Started a local Ray instance" in done.stderr


def test_an_unreachable_ray_address_is_said_once_and_never_holds_the_exit(
        ray_tmp: Path, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    address = f"127.0.0.1:{free_port()}"
    env = _env(ray_tmp, RAY_ADDRESS=address, RLMON_EXIT_TIMEOUT="3")
    started = time.monotonic()
    done = run_in_own_session([sys.executable, str(script)], timeout=CHILD_RUN_S, env=env)
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-3000:]
    said = [line for line in done.stderr.splitlines()
            if f"could not reach the Ray cluster at {address} (from RAY_ADDRESS)" in line]
    assert len(said) == 1, done.stderr[-3000:]
    assert said[0].startswith("rlmon:")
    assert took < 60, f"the script took {took:.0f}s with an exit budget of 3s"


ENSURE = """
import time
from rlmon.actors.runtime import RuntimeGone, ensure_runtime
started = time.monotonic()
try:
    ensure_runtime()
except RuntimeGone as exc:
    print("gone after %.1fs:" % (time.monotonic() - started), exc, flush=True)
"""


def test_ensure_runtime_on_the_main_thread_gives_up_after_the_connect_timeout(
        ray_tmp: Path, tmp_path: Path) -> None:
    """A script's own ``ensure_runtime()`` (main thread) asked to join the address a dead
    ``ray start`` left behind: before, ray.init retried it for minutes; now the wait ends at
    ``RLMON_RAY_CONNECT_TIMEOUT`` with rlmon's error, and the process exits at once."""
    address = (ray_tmp / "ray" / "ray_current_cluster").read_text().strip()
    script = tmp_path / "ensure.py"
    script.write_text(ENSURE)
    env = _env(ray_tmp, RAY_ADDRESS=address, RLMON_RAY_CONNECT_TIMEOUT="2")
    started = time.monotonic()
    done = run_in_own_session([sys.executable, str(script)], timeout=CHILD_RUN_S, env=env)
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("gone after "), done.stdout + done.stderr[-3000:]
    assert f"could not reach the Ray cluster at {address} (from RAY_ADDRESS)" in done.stdout
    assert "no answer within 2s (RLMON_RAY_CONNECT_TIMEOUT)" in done.stdout
    waited = float(done.stdout.split()[2].rstrip("s:"))
    assert 2.0 <= waited < 20.0, done.stdout
    assert took < 45, f"the script took {took:.0f}s with a connect timeout of 2s"



# a step delivered, so Ray and rlmon's runtime are up; then Ray shut down inside a thread's call
RACED = """
import time
import ray
from rlmon import Reporter
from rlmon.actors.runtime import console
from rlmon.actors.runtime import sink as ray_sink

rep = Reporter(run="raced", role="actor", heartbeat_seconds=3600)
rep.record("actor/loss", sum=1.0, count=1.0)
rep.end_step(0)
print("flushed", rep.flush(60), flush=True)
"""

RACED_SEND = RACED + """
connect = ray_sink.connect_ray


def shut_down_after_the_check(namespace, address=None):
    connect(namespace, address)
    ray.shutdown()  # the user's (or Ray's exit hook's) shutdown, between rlmon's check and call


ray_sink.connect_ray = shut_down_after_the_check
rep.record("actor/loss", sum=1.0, count=1.0)
rep.end_step(1)
print("flushed", rep.flush(5), flush=True)
rep.close()
print("closed", flush=True)
"""

RACED_RELAY = RACED + """
show = console.print_console


def shut_down_after_the_check(service, timeout=10.0):
    ray.shutdown()  # between the relay's check that Ray is up and its call
    show(service, timeout)


console.print_console = shut_down_after_the_check
deadline = time.monotonic() + 60
while ray.is_initialized() and time.monotonic() < deadline:
    time.sleep(0.05)
rep.close()
print("closed", flush=True)
"""


@pytest.mark.parametrize("script_text", [RACED_SEND, RACED_RELAY], ids=["sender", "console relay"])
def test_a_call_racing_ray_s_shutdown_never_starts_or_joins_a_ray(
        ray_tmp: Path, tmp_path: Path, script_text: str) -> None:
    """Ray shut down between a thread's check that Ray is up and its call (the Reporter's sender
    through a kept actor handle, the console relay): before, Ray's auto-init ran a bare
    ``ray.init()`` inside that call, which joined the cluster just shut down (Ray leaves its
    address in the driver's ``RAY_ADDRESS``) and held the thread, and the exit, for the whole
    exit budget; now the call fails at once."""
    script = tmp_path / "train.py"
    script.write_text(script_text)
    env = _env(ray_tmp, RLMON_EXIT_TIMEOUT="20")
    env["RAY_TMPDIR"] = str(ray_tmp)
    done = run_in_own_session([sys.executable, str(script)], timeout=CHILD_RUN_S, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "flushed True" in done.stdout and "closed" in done.stdout, done.stdout
    assert "Connecting to existing Ray cluster" not in done.stderr, done.stderr[-3000:]
    assert "Started a local Ray instance" in done.stderr
    assert "still sending" not in done.stderr, done.stderr[-3000:]
