"""Building a ServiceCore starts nothing: no thread, no socket, no OTLP exporter, whatever the
settings ask for; ``start()`` does (tests/service/service/test_service_start.py)."""

from __future__ import annotations

import threading
from pathlib import Path

from rlmon.service.config import Settings
from rlmon.service.service_core import ServiceCore
from rlmon.service.spine.sinks import OtlpSink


def test_the_constructor_starts_no_thread_and_binds_no_port(tmp_path: Path) -> None:
    settings = Settings.model_validate({
        "otlp": {"enabled": True, "endpoint": "http://127.0.0.1:9/v1/traces"}})
    before = set(threading.enumerate())
    core = ServiceCore(settings, state_dir=tmp_path, port=0, host="127.0.0.1")
    try:
        assert set(threading.enumerate()) == before
        assert core.port is None and core.ports.server is None
        assert core.spine.sinks[OtlpSink].otlp is None
    finally:
        core.close(0.0)
