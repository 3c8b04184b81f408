"""Shared fixtures and the suite's layers.

One local Ray cluster per test session (``ray_cluster``), for tests marked ray. Each test is
marked with its layer from its folder (docs/development.md, "The suite in layers"), so that
``pytest -m unit`` (or ``service``, ``ray``, ``real``, ``project``) runs one layer; a unit test
also gets the unit layer's 10 s limit, and one marked as needing Ray, a binary or time is
refused there.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from rlmon.service.contract.step_record import StepRecord
    from rlmon.service.service_core import ServiceCore

LAYERS = {"unit": "unit", "service": "service", "ray": "ray", "integration": "real",
          "integrations": "real", "frameworks": "real", "e2e": "real", "project": "project"}
UNIT_TIMEOUT_S = 10
_NOT_UNIT = ("ray", "integration", "slow", "examples")  # markers that place a test elsewhere
_TESTS = Path(__file__).parent


def layer_of(path: Path) -> str | None:
    """The layer of a test file, from the folder under tests/ it lives in."""
    parts = path.relative_to(_TESTS).parts if path.is_relative_to(_TESTS) else ()
    return LAYERS.get(parts[0]) if len(parts) > 1 else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        layer = layer_of(item.path)
        if layer is None:
            continue
        item.add_marker(layer)
        if layer != "unit":
            continue
        misplaced = [m for m in _NOT_UNIT if item.get_closest_marker(m)]
        if misplaced:
            raise pytest.UsageError(
                f"{item.nodeid} is marked {', '.join(misplaced)}: it belongs in tests/service, "
                "tests/ray or the real-parts folders, not in the unit layer")
        item.add_marker(pytest.mark.timeout(UNIT_TIMEOUT_S))


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A 2-CPU local Ray cluster without dashboard, started once and shared by every Ray test.

    Tests isolate themselves by namespace (``ray_namespace``), never by restarting Ray. A service
    started by a Reporter in an actor keeps its state where Ray's workers say (their environment
    is this process's): in a folder of the session's, not in the user's own state directory,
    where an earlier session's runs of the same names would be found.
    """
    os.environ.setdefault("XDG_STATE_HOME", str(tmp_path_factory.mktemp("xdg-state")))
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


@pytest.fixture
def service(tmp_path: Path, records: list[StepRecord]) -> Iterator[ServiceCore]:
    """A service on a loopback port whose history holds ``records`` (a fixture of the test's
    folder or module), closed after the test: the API's and the run page's tests."""
    from tests.support.web_support import serving

    with serving(tmp_path, records) as core:
        yield core
