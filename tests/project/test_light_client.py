"""``pip install rlmon`` is the client: the Reporter, its sinks, the framework integrations and
the ``rlmon`` command import, and a Reporter records and delivers, with every package that only
an extra installs (the service's, diagnose's, the dashboards', ...) unimportable."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions

from tests.support.paths import REPO

_CLIENT_EXTRAS = ("otlp", "gpu")  # optional parts of the client itself, imported when asked for


def _name(requirement: str) -> str:
    return re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _extras_only_modules() -> list[str]:
    """The top-level modules of the distributions that only the service-side extras bring."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    core = {_name(r) for r in project["dependencies"]}
    extras = project["optional-dependencies"]
    wanted = {_name(r) for extra in ("service", "diagnose", "report", "dashboards", "trace")
              for r in extras[extra]} - core
    return sorted(module for module, dists in packages_distributions().items()
                  if {_name(d) for d in dists} & wanted and not module.startswith("_")
                  and module not in sys.stdlib_module_names)


_CHILD = """
import importlib, sys
BLOCKED = set(sys.argv[1:])

class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"blocked: {name} (an extra)", name=name)
        return None

sys.meta_path.insert(0, Blocked())
import rlmon.actors.integrations, rlmon.actors.reporter, rlmon.actors.runtime
for package in ("rlmon.actors.reporter", "rlmon.actors.integrations"):
    for module in sorted(importlib.resources.files(package).iterdir()):
        if module.name.endswith(".py") and module.name != "__init__.py":
            importlib.import_module(f"{package}.{module.name[:-3]}")
from rlmon.cli import build_parser
build_parser()  # imports every command's module
from rlmon.actors.reporter import Reporter
from rlmon.actors.reporter.sink import LocalSink
sink = LocalSink()
rep = Reporter("r", "actor", rank={}, world={}, sink=sink)
rep.record("actor/loss", sum=1.0, count=2.0)
rep.end_step(0)
assert rep.flush(30)
rep.close()
assert [r.metrics["actor/loss"] for r in sink.records] == [0.5], sink.records
try:
    Reporter("r", "actor", rank={}, world={})
except ModuleNotFoundError as exc:
    assert "rlmon[service]" in str(exc), exc
else:
    raise AssertionError("a Reporter without sink= and without Ray was built")
loaded = sorted({m.split(".")[0] for m in sys.modules} & BLOCKED)
assert not loaded, loaded
print("ok")
"""


def test_the_extras_only_packages_are_found() -> None:
    """The block list is real: the service's and the offline tools' packages are in it, and
    the client's own dependencies are not."""
    blocked = _extras_only_modules()
    assert {"ray", "slack_sdk", "wandb", "matplotlib", "grafana_foundation_sdk"} <= set(blocked)
    assert not {"numpy", "pydantic", "yaml", "prometheus_client", "psutil"} & set(blocked)


def test_the_client_imports_and_reports_without_any_extra() -> None:
    done = subprocess.run([sys.executable, "-c", "import importlib.resources\n" + _CHILD,
                           *_extras_only_modules()],
                          capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
