"""``ServiceCore.start()`` starts what the constructor does not (the notifier deliveries, the
goodput ledger, the OTLP export, the HTTP server and the run page's cache warmer), once;
``close()`` ends every one of them."""

from __future__ import annotations

import threading
import urllib.request
from pathlib import Path

from rlmon.service.config import Settings
from rlmon.service.service_core import ServiceCore
from rlmon.service.spine.sinks import OtlpSink


def test_start_starts_the_threads_and_the_server_and_close_ends_them(tmp_path: Path) -> None:
    settings = Settings.model_validate({
        "otlp": {"enabled": True, "endpoint": "http://127.0.0.1:9/v1/traces"}})
    before = set(threading.enumerate())
    core = ServiceCore(settings, state_dir=tmp_path, port=0, host="127.0.0.1")
    assert core.start() is core.start()  # once
    try:
        names = {t.name for t in set(threading.enumerate()) - before}
        assert {"rlmon-goodput", "rlmon-web-warm", "rlmon-notify-console"} <= names, names
        assert core.port is not None and core.spine.sinks[OtlpSink].otlp is not None
        with urllib.request.urlopen(f"http://127.0.0.1:{core.port}/healthz", timeout=10) as r:
            assert r.read() == b"ok\n"
    finally:
        core.close(5.0)
    left = [t for t in set(threading.enumerate()) - before if t.is_alive()]
    for thread in left:
        thread.join(10.0)
    assert [t.name for t in left if t.is_alive()] == []
