"""``rlmon serve`` in the session's Ray cluster: health endpoint, live ingest, graceful shutdown."""

from __future__ import annotations

import argparse
import threading
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.support.network import free_port
from tests.support.polling import PATIENCE_S, wait_for

pytestmark = pytest.mark.ray


def test_serve_health_ingest_and_graceful_stop(
    ray_cluster: Any, ray_namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rlmon.actors.reporter import Reporter
    from rlmon.cli import build_parser
    from rlmon.commands import serve

    port = free_port()
    args = build_parser().parse_args([
        "serve", "--namespace", ray_namespace, "--port", str(port), "--host", "127.0.0.1",
        "--state-dir", str(tmp_path), "--deadline", "30",
    ])
    assert isinstance(args, argparse.Namespace)
    # ray.init / ray.shutdown belong to the session fixture here
    monkeypatch.setattr(ray_cluster, "init", lambda **kw: None)
    monkeypatch.setattr(ray_cluster, "shutdown", lambda: None)
    stop = threading.Event()
    result: dict[str, int] = {}
    thread = threading.Thread(target=lambda: result.update(rc=serve.run_serve(args, stop)))
    thread.start()

    def healthy() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    wait_for(healthy, PATIENCE_S, "serve to become healthy")
    rep = Reporter("served", "actor", world={"dp": 2}, rank={"dp": 0}, namespace=ray_namespace,
                   start_service=False, step_seconds=False)
    rep.record("actor/loss", sum=2.0, count=4.0)
    rep.end_step(0)  # rank 1 never reports: only the graceful stop finalizes this step
    assert rep.flush(PATIENCE_S)
    stop.set()
    thread.join(PATIENCE_S)
    assert result["rc"] == 0
    from rlmon.service.storage.history import HistoryStore

    steps = HistoryStore(tmp_path / "history.sqlite").steps("served")
    assert [(s["step"], s["complete"], s["metrics"]["actor/loss"]) for s in steps] == [
        (0, False, 0.5)]
    rep.close(timeout=0.1)


def test_service_resource_pins_the_service_to_the_node_offering_it(
    ray_cluster: Any, ray_namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`--service-resource` is how the Helm chart keeps the service in the rlmon pod: the actor
    requests the resource, so it runs only where it is offered (here the head node's built-in
    `node:__internal_head__`; in Kubernetes the pod's `ray start --resources`)."""
    from rlmon.actors.runtime import SERVICE
    from rlmon.cli import build_parser
    from rlmon.commands import serve

    monkeypatch.setattr(ray_cluster, "init", lambda **kw: None)
    monkeypatch.setattr(ray_cluster, "shutdown", lambda: None)
    missing = build_parser().parse_args([
        "serve", "--namespace", ray_namespace + "-x", "--port", "0", "--host", "127.0.0.1",
        "--state-dir", str(tmp_path / "x"), "--service-resource", "rlmon_no_such_node",
    ])
    assert serve.run_serve(missing, threading.Event()) == 1
    assert "no Ray node offers the resource 'rlmon_no_such_node'" in capsys.readouterr().err

    resource = "node:__internal_head__"
    assert ray_cluster.cluster_resources().get(resource, 0) >= 1
    port = free_port()
    args = build_parser().parse_args([
        "serve", "--namespace", ray_namespace, "--port", str(port), "--host", "127.0.0.1",
        "--state-dir", str(tmp_path), "--service-resource", resource,
    ])
    stop = threading.Event()
    result: dict[str, int] = {}
    thread = threading.Thread(target=lambda: result.update(rc=serve.run_serve(args, stop)))
    thread.start()
    try:
        def healthy() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                    return r.status == 200
            except OSError:
                return False

        wait_for(healthy, PATIENCE_S, "the pinned service's /healthz")
        service = ray_cluster.get_actor(SERVICE, namespace=ray_namespace)
        placed = ray_cluster.get(service.placement.remote(), timeout=PATIENCE_S)
        assert placed["resources"].get(resource) == 1.0
    finally:
        stop.set()
        thread.join(PATIENCE_S)
    assert result["rc"] == 0
