"""No SQL text is built from a value (issue 32): across rlmon/service, a string that reads as SQL
is assembled only from literals (a fragment chosen by code, ``query += " AND step = ?"``, is
fine); an f-string, ``%``, ``.format()`` or ``join`` that puts a value into SQL text, or a ``+``
of SQL text with anything but a literal or such a literal-only variable, fails this test. Values
reach SQLite as bound parameters. A rule over the source (the AST), so it holds for code not yet
written.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[3] / "rlmon" / "service"
SQL = re.compile(r"\b(SELECT|INSERT|UPDATE|DELETE|CREATE|ALTER|DROP|PRAGMA|WHERE|ORDER BY|"
                 r"VALUES|FROM|AND|json_extract)\b")


def _literal(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _texts(node: ast.AST) -> list[str]:
    """The literal pieces of a string expression."""
    return [n.value for n in ast.walk(node) if _literal(n) is not None]  # type: ignore[attr-defined]


def _sqlish(node: ast.AST) -> bool:
    return any(SQL.search(t) for t in _texts(node))


class _Scope(ast.NodeVisitor):
    """Flags SQL text built from a value, function by function (a name is 'literal-only' when
    every assignment to it in the function is literal-only)."""

    def __init__(self, path: Path) -> None:
        self.path, self.found = path, []  # type: ignore[var-annotated]
        self.safe: set[str] = set()
        self.function = "<module>"
        self.sql: set[str] = set()  # names assigned SQL text somewhere in the function

    def _safe(self, node: ast.AST) -> bool:
        if _literal(node) is not None:
            return True
        if isinstance(node, ast.Name):
            return node.id in self.safe
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return self._safe(node.left) and self._safe(node.right)
        if isinstance(node, ast.IfExp):
            return self._safe(node.body) and self._safe(node.orelse)
        return False

    def _flag(self, node: ast.AST, why: str) -> None:
        where = f"{self.path.relative_to(SOURCE.parent.parent)}:{self.function}"
        self.found.append(f"{where}:{node.lineno}: {why}")  # type: ignore[attr-defined]

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        outer, self.safe = self.safe, set(self.safe)
        caller, self.function = self.function, node.name
        # names assigned only literal-only SQL text (two passes: a name built from another)
        for _ in range(2):
            assigned: dict[str, bool] = {}
            for n in ast.walk(node):
                if isinstance(n, ast.Assign):
                    for t in n.targets:
                        if isinstance(t, ast.Name):
                            assigned[t.id] = assigned.get(t.id, True) and self._safe(n.value)
                elif isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name):
                    assigned[n.target.id] = assigned.get(n.target.id, True) and self._safe(n.value)
            self.safe = outer | {k for k, ok in assigned.items() if ok}
        self.sql = {t.id for n in ast.walk(node) if isinstance(n, ast.Assign) and _sqlish(n.value)
                    for t in n.targets if isinstance(t, ast.Name)}
        self.generic_visit(node)
        self.safe, self.function = outer, caller

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        if _sqlish(node) and any(isinstance(v, ast.FormattedValue) for v in node.values):
            self._flag(node, "an f-string puts a value into SQL text")
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if isinstance(node.op, ast.Mod) and _literal(node.left) and SQL.search(_literal(node.left) or ""):
            self._flag(node, "%-formatting puts a value into SQL text")
        elif isinstance(node.op, ast.Add) and _sqlish(node) and not self._safe(node):
            self._flag(node, "SQL text + a value")
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if (isinstance(node.op, ast.Add) and isinstance(node.target, ast.Name)
                and node.target.id in self.sql and not self._safe(node.value)):
            self._flag(node, "SQL text += a value")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in ("format", "join") and \
                _literal(func.value) is not None and (
                    _sqlish(func.value) or any(_sqlish(a) for a in node.args)):
            self._flag(node, f"str.{func.attr} builds SQL text")
        if isinstance(func, ast.Attribute) and func.attr in ("execute", "executemany", "read") \
                and node.args and not isinstance(node.args[0], ast.Constant) \
                and not self._safe(node.args[0]) and _sqlish(node.args[0]):
            self._flag(node, f"{func.attr}() of SQL text built from a value")
        self.generic_visit(node)


def violations(path: Path) -> list[str]:
    scope = _Scope(path)
    scope.visit(ast.parse(path.read_text(), str(path)))
    return scope.found


# Functions that put text chosen by code (never input) into SQL, each reviewed: the list is
# closed, so a new function that builds SQL from a value fails the test until it is looked at.
REVIEWED = {
    # table names from a literal tuple; the columns' names as SQLite's table_info lists them
    "rlmon/service/storage/history.py:_add_attempts",
    "rlmon/service/storage/history.py:_columns",
    "rlmon/service/storage/history.py:_add_cost",
    # the catalog's key-curve names (code constants) in the back-fill's JSON paths
    "rlmon/service/storage/history.py:_fill_curve_rows",
    # `_stream_filter`'s literal clauses, columns from a literal tuple, '?' placeholders
    "rlmon/service/storage/history.py:alert_states",
    "rlmon/service/storage/history.py:stream_states",
    "rlmon/service/storage/history.py:last_steps",
    "rlmon/service/storage/history.py:latest_attempts",
    "rlmon/service/storage/history.py:steps",
    "rlmon/service/storage/history.py:curve_values",
    "rlmon/service/storage/history.py:samples",
    "rlmon/service/storage/history.py:alerts",
    "rlmon/service/storage/history.py:stops",
    "rlmon/service/storage/history.py:liveness_states",
    "rlmon/service/storage/history.py:liveness",
    "rlmon/service/storage/history.py:prune",
    # one '?' per claimed row id
    "rlmon/service/alerting/notify/outbox.py:_due",
    "rlmon/service/alerting/notify/outbox.py:next_due",
}


def test_no_sql_text_is_built_from_a_value() -> None:
    found = [v for path in sorted(SOURCE.rglob("*.py")) for v in violations(path)
             if v.rsplit(":", 2)[0] not in REVIEWED]
    assert found == []


def test_the_rule_catches_each_way_of_building_sql(tmp_path: Path) -> None:
    cases = {
        "fstring": "def f(db, m):\n    db.execute(f\"SELECT json_extract(line, '{m}') FROM steps\")\n",
        "percent": "def f(db, m):\n    db.execute(\"SELECT x FROM t WHERE a = '%s'\" % m)\n",
        "format": "def f(db, m):\n    db.execute(\"SELECT x FROM t WHERE a = '{}'\".format(m))\n",
        "plus": "def f(db, m):\n    q = \"SELECT x FROM t WHERE a = '\" + m + \"'\"\n    db.execute(q)\n",
        "augmented": "def f(db, m):\n    q = \"SELECT x FROM t\"\n    q += m\n    db.execute(q)\n",
        "join": "def f(db, ms):\n    db.execute(\"SELECT \" + \", \".join(ms) + \" FROM t\")\n",
    }
    for name, code in cases.items():
        path = tmp_path / f"{name}.py"
        path.write_text(code)
        scope = _Scope(path)
        scope.path = SOURCE / path.name  # relative naming only
        scope.visit(ast.parse(code))
        assert scope.found, name
    fine = ("def f(db, step, role):\n    q = \"SELECT x FROM t WHERE a = ?\"\n"
            "    if role:\n        q += \" AND role = ?\"\n    db.execute(q + \" ORDER BY a\", (step,))\n")
    scope = _Scope(SOURCE / "fine.py")
    scope.visit(ast.parse(fine))
    assert scope.found == []
