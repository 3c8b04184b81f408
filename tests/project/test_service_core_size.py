"""ServiceCore wires the spine's stages and owns their lifecycle; the work is in the stages
(docs/design.md, "The spine"). It stays small: at most 12 methods and 12 attributes, public and
private, counted on the class as the architecture review counted them (29 and 37 at 68dea3e)."""

from __future__ import annotations

import ast
from pathlib import Path

import rlmon

SERVICE_CORE = Path(rlmon.__file__).parent / "service" / "service_core.py"
LIMIT = 12


def _class(path: Path, name: str) -> ast.ClassDef:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)


def methods(cls: ast.ClassDef) -> list[str]:
    """Every function defined in the class body (properties and dunders included)."""
    return [f.name for f in cls.body if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)]


def attributes(cls: ast.ClassDef) -> set[str]:
    """Every ``self.<name>`` assigned anywhere in the class, and every name assigned in its
    body."""
    stored = {node.attr for node in ast.walk(cls)
              if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
              and isinstance(node.value, ast.Name) and node.value.id == "self"}
    for node in cls.body:
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AnnAssign) else [])
        stored |= {t.id for t in targets if isinstance(t, ast.Name)}
    return stored


def test_the_counts_see_what_they_count() -> None:
    """The counter on a class with known members (so the limit below cannot pass vacuously)."""
    cls = ast.parse("class C:\n"
                    "    x: int = 0\n"
                    "    def __init__(self):\n        self.a = 1\n        self._b = 2\n"
                    "    @property\n    def p(self):\n        return self.a\n"
                    "    def _m(self):\n        self.a, self.c = 1, 2\n").body[0]
    assert isinstance(cls, ast.ClassDef)
    assert methods(cls) == ["__init__", "p", "_m"]
    assert attributes(cls) == {"x", "a", "_b", "c"}


def test_service_core_has_at_most_twelve_methods_and_twelve_attributes() -> None:
    cls = _class(SERVICE_CORE, "ServiceCore")
    found, stored = methods(cls), attributes(cls)
    assert len(found) <= LIMIT, f"ServiceCore has {len(found)} methods: {found}"
    assert len(stored) <= LIMIT, f"ServiceCore has {len(stored)} attributes: {sorted(stored)}"
