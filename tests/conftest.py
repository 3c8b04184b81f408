"""Shared fixtures. One local Ray cluster per test session (``ray_cluster``), for tests marked ray."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    """A 2-CPU local Ray cluster without dashboard, started once and shared by every Ray test.

    Tests isolate themselves by namespace (``ray_namespace``), never by restarting Ray.
    """
    os.environ.setdefault("RAY_DISABLE_USAGE_STATS", "1")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        ray.init(
            num_cpus=2, include_dashboard=False, namespace="rlmon-tests",
            log_to_driver=False, configure_logging=False,
        )
    yield ray
    ray.shutdown()


@pytest.fixture
def ray_namespace(ray_cluster: Any, request: pytest.FixtureRequest) -> str:
    """A namespace of this test's own, so named actors never leak between tests."""
    import re

    return "t-" + re.sub(r"[^A-Za-z0-9]+", "-", request.node.name)[:60]
