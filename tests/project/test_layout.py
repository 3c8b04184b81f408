"""The layout is the architecture: the pure core never reaches up into the Ray shells."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import rlmon

PACKAGE = Path(rlmon.__file__).parent


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_the_core_imports_neither_ray_nor_the_shells() -> None:
    offenders = [
        f"{path.relative_to(PACKAGE)}: {module}"
        for path in sorted((PACKAGE / "service").rglob("*.py"))
        for module in _imports(path)
        if module == "ray" or module.startswith(("ray.", "rlmon.actors"))
    ]
    assert offenders == []


def _reaching(package: str, forbidden: tuple[str, ...]) -> list[str]:
    """``path: module`` for each import (lazy ones too) of ``package``'s modules into
    ``forbidden`` packages."""
    root = PACKAGE.joinpath(*package.split(".")[1:])
    return [
        f"{path.relative_to(PACKAGE)}: {module}"
        for path in sorted(root.rglob("*.py"))
        for module in sorted(_imports(path))
        if any(module == f or module.startswith(f + ".") for f in forbidden)
    ]


def test_aggregation_imports_neither_alerting_nor_export() -> None:
    """A step is assembled before anything judges or exports it: the aggregator hands the
    service records and typed stats, and knows nothing of rules or series."""
    assert _reaching("rlmon.service.aggregation",
                     ("rlmon.service.alerting", "rlmon.service.export")) == []


def test_the_metric_vocabulary_imports_no_later_stage() -> None:
    """metrics/ is the bottom layer every stage reads (names, forms, partial merge, ranks)."""
    later = ("contract", "aggregation", "alerting", "export")
    assert _reaching("rlmon.service.metrics",
                     tuple(f"rlmon.service.{stage}" for stage in later)) == []


def test_the_worker_side_client_imports_ray_only_lazily() -> None:
    """No module-level ``import ray`` in rlmon.actors.reporter: only the default sink, when a
    Reporter is created without one, imports it inside a function."""
    offenders = []
    for path in sorted((PACKAGE / "actors" / "reporter").rglob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.relative_to(PACKAGE)}:{node.lineno}: {name}" for name in names
                          if name == "ray" or name.startswith("ray.")]
    assert offenders == []


def test_no_module_cites_a_file_outside_the_repository() -> None:
    """Docstrings cite docs/ pages (docs/design.md, docs/contract.md, ...); DESIGN.md is not
    in the repository."""
    offenders = [f"{path.relative_to(PACKAGE)}:{n}" for path in sorted(PACKAGE.rglob("*"))
                 if path.is_file() and path.suffix in (".py", ".md", ".txt", ".json", ".yaml")
                 for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
                 if "DESIGN.md" in line]
    assert offenders == []


def test_importing_every_core_module_loads_no_ray() -> None:
    modules = sorted(
        "rlmon.service." + ".".join(p.relative_to(PACKAGE / "service").with_suffix("").parts)
        for p in (PACKAGE / "service").rglob("*.py") if p.name != "__init__.py")
    code = ("import sys\n" + "".join(f"import {m}\n" for m in modules)
            + "assert 'ray' not in sys.modules, sorted(m for m in sys.modules if 'ray' in m)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_worker_side_client_loads_no_ray() -> None:
    """rlmon.actors.reporter runs in every training process: importing any of its modules (and
    creating a Reporter with a Ray-free sink) loads no Ray; only the default sink does."""
    modules = sorted(
        "rlmon.actors.reporter." + p.stem
        for p in (PACKAGE / "actors" / "reporter").glob("*.py") if p.name != "__init__.py")
    code = ("import sys\n" + "".join(f"import {m}\n" for m in modules)
            + "from rlmon.actors.reporter import Reporter\n"
            + "from rlmon.actors.reporter.sink import LocalSink\n"
            + "rep = Reporter('r', 'actor', rank={}, world={}, sink=LocalSink())\n"
            + "rep.record('actor/loss', sum=1.0, count=1.0)\n"
            + "rep.end_step(0)\n"
            + "assert rep.flush(10)\n"
            + "rep.close()\n"
            + "assert 'ray' not in sys.modules, sorted(m for m in sys.modules if 'ray' in m)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
