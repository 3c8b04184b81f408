"""Loopback ports for tests."""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

__all__ = ["free_port"]

# Ray's worker processes take ports up to 19999 (its default max_worker_port); above that and
# below the system's ephemeral range, only a server told its port binds one
_ABOVE_RAY_WORKERS = 20000
_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
_draw = random.Random(os.urandom(16))  # not the global one a seeded test (hypothesis) replays


def _ephemeral_start() -> int:
    try:
        return int(_EPHEMERAL.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for a server a test starts).

    Drawn outside the system's ephemeral range: a port the system hands to a bind to port 0 can
    be taken by any process between this pick and the server's own bind (a Ray driver's or a
    Ray agent's gRPC server did: the test's HTTP check read an HTTP/2 frame). Where that range
    leaves no room, the system's pick."""
    start = _ephemeral_start()
    if start - _ABOVE_RAY_WORKERS >= 1000:
        for _ in range(100):
            port = _draw.randrange(_ABOVE_RAY_WORKERS, start)
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    continue  # in use: another draw
                return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
