"""No constructor in the service starts a thread (docs/design.md, "The spine"): building the
core (every notifier, the goodput ledger, OTLP and the forward sink asked for), the aggregator's
server and the run page's cache warmer starts none; their ``start()`` does, and ``close()`` ends
what it started. tests/project/test_no_thread_in_constructors.py checks the source the same way.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rlmon.service.aggregation.aggregator import AggregatorCore, AggregatorServer
from rlmon.service.config import Settings
from rlmon.service.service_core import ServiceCore
from rlmon.service.spine.sinks import OtlpSink
from rlmon.service.storage.history import HistoryStore
from rlmon.service.web.api import WebApi
from rlmon.service.web.server import CacheWarmer


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the threads started while the test runs (``Thread.start`` watched)."""
    names: list[str] = []
    original: Callable[[threading.Thread], None] = threading.Thread.start

    def start(thread: threading.Thread) -> None:
        names.append(thread.name)
        original(thread)

    monkeypatch.setattr(threading.Thread, "start", start)
    return names


def _alive(name: str) -> bool:
    return any(t.name == name and t.is_alive() for t in threading.enumerate())


def test_building_the_core_with_everything_asked_for_starts_no_thread(
        tmp_path: Path, started: list[str]) -> None:
    settings = Settings.model_validate({
        "notifiers": {"console": {"enabled": True},
                      "webhook": {"url": "http://127.0.0.1:9/hook"}},
        "otlp": {"enabled": True, "endpoint": "http://127.0.0.1:9/v1/traces"},
        "forward": {"tensorboard": {"enabled": True, "log_dir": str(tmp_path / "tb")}}})
    before = set(threading.enumerate())
    core = ServiceCore(settings, state_dir=tmp_path / "state", port=0, host="127.0.0.1")
    try:
        assert started == [] and set(threading.enumerate()) == before
        assert len(core.dispatcher.notifiers) == 2  # what start() would give a thread each
        assert core.ports.server is None and core.ports.warmer is None
        assert core.spine.sinks[OtlpSink].otlp is None
    finally:
        core.close(0.0)
    assert started == []  # closing what never started starts nothing either


def test_the_aggregator_server_delivers_on_its_thread_only_once_started(
        started: list[str]) -> None:
    delivered: list[Any] = []
    server = AggregatorServer(AggregatorCore(), lambda records, shard, stats: delivered.append(
        records), tick_s=0.01)
    assert started == [] and not _alive("rlmon-aggregator")
    assert server.start() is server and server.start() is server  # idempotent
    assert started == ["rlmon-aggregator"] and _alive("rlmon-aggregator")
    assert server.close()
    assert not _alive("rlmon-aggregator")


def test_a_server_never_started_closes_and_delivers_what_it_holds(started: list[str]) -> None:
    delivered: list[Any] = []
    server = AggregatorServer(AggregatorCore(), lambda records, shard, stats: delivered.append(
        records))
    assert server.close() and started == []
    assert delivered  # close() still hands the counters over (on the caller's thread)


def test_the_cache_warmer_warms_on_its_thread_only_once_started(started: list[str]) -> None:
    store = HistoryStore(":memory:")
    try:
        warmer = CacheWarmer(WebApi(store), period=0.01)
        assert started == [] and not _alive("rlmon-web-warm")
        assert warmer.start() is warmer and warmer.start() is warmer  # idempotent
        assert started == ["rlmon-web-warm"] and _alive("rlmon-web-warm")
        warmer.close()
        assert not _alive("rlmon-web-warm")
    finally:
        store.close()
