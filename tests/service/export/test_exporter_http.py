"""The exporter's HTTP server on loopback: /metrics and /healthz."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest

from rlmon.service.export.exporter import MetricsState
from rlmon.service.export.http import serve_metrics
from tests.unit.export.test_exporter import IS_RATIO, record


def test_http_server_metrics_and_healthz() -> None:
    state = MetricsState()
    state.update(record(1, actor__is_ratio=1.25))
    healthy = [True]
    server = serve_metrics(state, port=0, host="127.0.0.1", health=lambda: healthy[0])
    try:
        base = f"http://127.0.0.1:{server.port}"
        text = urllib.request.urlopen(base + "/metrics", timeout=5).read().decode()
        assert f'{IS_RATIO}{{role="actor",run="grpo-7b"}} 1.25' in text
        assert urllib.request.urlopen(base + "/healthz", timeout=5).read() == b"ok\n"
        healthy[0] = False
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(base + "/healthz", timeout=5)
        assert info.value.code == 503
    finally:
        server.close()
