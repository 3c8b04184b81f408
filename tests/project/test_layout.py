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


def _imports_by_name(tree: ast.AST) -> bool:
    """Whether a module imports modules from strings (``importlib.import_module``,
    ``__import__``)."""
    return any(isinstance(node, ast.Call) and (
        (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
        or (isinstance(node.func, ast.Name) and node.func.id in ("import_module", "__import__")))
        for node in ast.walk(tree))


def _module_graph() -> dict[str, set[str]]:
    """Each module of rlmon -> the modules of rlmon it imports, at any depth of its code: lazy
    (function-level) and ``TYPE_CHECKING`` imports count, and ``from pkg import name`` counts
    ``pkg.name`` when that is a module; a module that imports from strings
    (``importlib.import_module``) imports every module of rlmon a string of it names. Importing
    ``a.b.c`` also runs ``a.b``'s ``__init__``, so it depends on that package too, unless the
    importer lives inside it (Python has run its own packages' ``__init__`` before it)."""
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ("rlmon", *path.relative_to(PACKAGE).with_suffix("").parts)
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if _imports_by_name(tree):
            targets.update(node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)
                           and isinstance(node.value, str) and node.value in names)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                targets.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in names
                               else base for alias in node.names)
        edges = {t for t in targets if t in names}
        own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 2)}
        edges |= {parent for t in list(edges) for i in range(1, t.count(".") + 1)
                  if (parent := ".".join(t.split(".")[:i])) in names and parent not in own}
        graph[name] = edges - {name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycles_lazy_imports_included() -> None:
    """No two modules need each other, not even through a function-level import: a reader of
    one is never sent to the other to understand it, and a cut never has to do without."""
    assert _cycles(_module_graph()) == []


def test_the_cycle_check_finds_a_lazy_cycle() -> None:
    """The check above can fail: a lazy import back, through a package's ``__init__``, is one."""
    graph = _module_graph()
    graph["rlmon.actors.reporter.facade"] |= {"rlmon.actors.runtime"}
    assert any({"rlmon.actors.reporter", "rlmon.actors.reporter.facade",
                "rlmon.actors.runtime"} <= set(cycle) for cycle in _cycles(graph))


def test_imports_by_name_are_in_the_graph() -> None:
    """A module that imports modules from strings names them itself, so the cycle check sees
    those imports: the registry of generated files imports its producers by name (and they
    import the Artifact type from below it, not from the registry)."""
    by_name = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if _imports_by_name(tree):
            named = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
                     and isinstance(n.value, str) and n.value.startswith("rlmon.")]
            assert named, f"{path.relative_to(PACKAGE)} imports modules it does not name"
            by_name.append(str(path.relative_to(PACKAGE)))
    assert "service/generated.py" in by_name
    graph = _module_graph()
    assert "rlmon.service.alerting.rules_doc" in graph["rlmon.service.generated"]
    assert "rlmon.service.generated" not in graph["rlmon.service.alerting.rules_doc"]
