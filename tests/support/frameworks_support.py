"""Shared by ``tests/test_frameworks_*.py``: the GPU frameworks' own functions on CPU tensors.

OpenRLHF, SkyRL and verl need GPUs to train, but their loss and metric modules run on CPU
tensors once the package is installed without its GPU dependencies (``make test-extras``;
docs/integrations.md, "Checked against the frameworks' own functions"). These helpers import
those modules, and keep the ledger of every value compared: rlmon's against the framework's own
and against the float64 truth on the un-split data.

Skipped in the main venv (no torch), required in the extras venv (``RLMON_REQUIRE_EXTRAS=1``),
like :func:`extras.optional_import`.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import os
import sys
from dataclasses import asdict, dataclass, field
from types import ModuleType

import pytest

from tests.support.extras import optional_import

__all__ = ["Ledger", "framework_module", "optional_import"]


def _bare_package(name: str) -> None:
    """Register package ``name`` without running its ``__init__``, so that one of its submodules
    can be imported alone. Nothing is replaced: the submodules are the framework's own files."""
    if name in sys.modules:
        return
    parent = name.rpartition(".")[0]
    if parent:
        importlib.import_module(parent)
    spec = importlib.util.find_spec(name)
    if spec is None or spec.submodule_search_locations is None:
        raise ModuleNotFoundError(f"no package {name!r}")
    package = ModuleType(name)
    package.__path__ = list(spec.submodule_search_locations)
    package.__spec__ = spec
    package.__file__ = spec.origin
    sys.modules[name] = package


def framework_module(name: str, *, skip_init: tuple[str, ...] = ()) -> ModuleType:
    """Import a framework module; ``skip_init`` names packages whose ``__init__`` imports
    GPU-only or unrelated code the module does not need (each caller says which and why).

    Skips the calling test module when the import fails, unless ``RLMON_REQUIRE_EXTRAS=1``.
    """
    try:
        for package in skip_init:
            _bare_package(package)
        return importlib.import_module(name)
    except ImportError as exc:
        if os.environ.get("RLMON_REQUIRE_EXTRAS") == "1":
            raise
        pytest.skip(f"{name} not importable here: {exc}", allow_module_level=True)
        raise  # unreachable: pytest.skip raises


@dataclass(frozen=True)
class Comparison:
    framework: str
    key: str
    case: str
    rlmon: float
    framework_value: float | None
    truth: float | None
    equal_framework: bool | None
    equal_truth: bool | None


def _close(a: float, b: float, rel: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=rel, abs_tol=rel)


@dataclass
class Ledger:
    """Every (key, case) comparison of one framework's tests.

    :meth:`check` asserts what rlmon claims: equal to the framework's own value (``exact`` and
    ``relayed`` keys where the framework's reduction is the canonical one) and/or equal to the
    truth; ``differs_*`` asserts a documented deviation (by more than ``gap``, relative), so a
    framework that changes its reduction fails the test. With ``RLMON_FRAMEWORKS_LEDGER=path``
    every comparison is appended to that file as a JSON line (the counts in docs/integrations.md).
    """

    framework: str
    rel: float = 1e-9  # relative tolerance of "equal"
    rows: list[Comparison] = field(default_factory=list)

    def check(
        self,
        key: str,
        case: str,
        rlmon: float,
        *,
        framework: float | None = None,
        truth: float | None = None,
        differs_framework: bool = False,
        differs_truth: bool = False,
        rel: float | None = None,
        gap: float = 1e-3,
    ) -> None:
        rel = self.rel if rel is None else rel
        eq_fw = None if framework is None else _close(rlmon, framework, rel)
        eq_truth = None if truth is None else _close(rlmon, truth, rel)
        row = Comparison(self.framework, key, case, float(rlmon),
                         None if framework is None else float(framework),
                         None if truth is None else float(truth), eq_fw, eq_truth)
        self.rows.append(row)
        path = os.environ.get("RLMON_FRAMEWORKS_LEDGER")
        if path:
            with open(path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(asdict(row)) + "\n")
        where = f"{self.framework} {key} [{case}]: rlmon {rlmon!r}"
        if framework is not None:
            if differs_framework:
                assert not _close(rlmon, framework, gap), f"{where} == framework {framework!r}"
            else:
                assert eq_fw, f"{where} != framework {framework!r}"
        if truth is not None:
            if differs_truth:
                assert not _close(rlmon, truth, gap), f"{where} == truth {truth!r}"
            else:
                assert eq_truth, f"{where} != truth {truth!r}"


def check_row_coverage(framework: str, row_checks: dict[str, str], tests: dict[str, object]) -> None:
    """Every keymap row of ``framework`` names the test that checks it, or says in the keymap
    (``unchecked``) why it cannot be checked here."""
    from rlmon.service.metrics import keymaps

    rows = {row.key: row for row in keymaps.mappings(framework)}
    assert set(rows) == set(row_checks)
    for key, test in row_checks.items():
        if test:
            assert test in tests, test
            assert not rows[key].unchecked, key
        else:
            assert rows[key].unchecked, f"{key}: neither checked nor says why"
