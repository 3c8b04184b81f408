"""Framework extras: pyproject names each framework package, and importing every integration
module imports none of the frameworks (they are GPU frameworks, absent in CI)."""

from __future__ import annotations

import subprocess
import sys
import tomllib

from tests.support.paths import REPO

ROOT = REPO
FRAMEWORKS = {"openrlhf": "openrlhf", "skyrl": "skyrl", "verl": "verl", "trl": "trl",
              "vllm": "vllm", "deepspeed": "deepspeed"}


def test_every_framework_has_an_extra_naming_its_package() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    for extra, package in FRAMEWORKS.items():
        assert extra in extras, extra
        assert any(req.split(">")[0].split("=")[0].strip() == package for req in extras[extra])


def test_integration_modules_import_no_framework() -> None:
    code = (
        "import sys\n"
        "from rlmon.actors.integrations import deepspeed, openrlhf, skyrl, trl, verl, vllm\n"
        f"print(sorted(m for m in {[*sorted(FRAMEWORKS.values()), 'transformers', 'torch']!r} "
        "if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT, timeout=60).stdout
    assert out.strip() == "[]", out
