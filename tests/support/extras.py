"""Optional heavy dependencies (torch, vLLM, DeepSpeed): skipped in the main venv, required in
the extras venv that `make test-extras` builds (RLMON_REQUIRE_EXTRAS=1)."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest

__all__ = ["optional_import"]


def optional_import(name: str) -> ModuleType:
    if os.environ.get("RLMON_REQUIRE_EXTRAS") == "1":
        return importlib.import_module(name)
    return pytest.importorskip(name)
