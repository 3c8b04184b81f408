"""The unit layer's own rules can fail (tests/support/unit_layer.py)."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading

import pytest

from tests.support.unit_layer import LayerViolation, threads_left


def test_a_subprocess_is_refused() -> None:
    with pytest.raises(LayerViolation, match="starts a subprocess"):
        subprocess.run([sys.executable, "-c", "pass"], check=False)


def test_a_socket_is_refused() -> None:
    with socket.socket() as sock, pytest.raises(LayerViolation, match=r"socket\.bind"):
        sock.bind(("127.0.0.1", 0))


def test_a_thread_left_alive_is_named_and_a_finished_one_is_not() -> None:
    before = set(threading.enumerate())
    release = threading.Event()
    lingering = threading.Thread(target=release.wait, name="lingering", daemon=True)
    done = threading.Thread(target=lambda: None, name="done")
    lingering.start()
    done.start()
    try:
        assert threads_left(before, grace=0.05) == ["lingering (daemon)"]
    finally:
        release.set()
        lingering.join()
    assert threads_left(before, grace=0.05) == []
