"""No SQL text is built from a value (issues 32 and 40): across the whole ``rlmon`` package, a
string that reads as SQL is assembled only from literals (a fragment chosen by code,
``query += " AND step = ?"``, is fine); an f-string, ``%``, ``.format()`` or ``join`` that puts
a value into SQL text, or a ``+`` of SQL text with anything but a literal or such a literal-only
variable, fails this test. Values reach SQLite as bound parameters. A rule over the source (the
AST), so it holds for code not yet written. What is allowed is reviewed statement by statement
(its text, as the AST prints it): another statement of the same function that builds SQL from a
value fails, and so does an allowed one once it is changed.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import re
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[3] / "rlmon"
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
        self.statements: list[ast.stmt] = []  # the statements around the node visited

    def visit(self, node: ast.AST) -> None:
        inner = isinstance(node, ast.stmt) and not isinstance(
            node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        if inner:
            self.statements.append(node)  # type: ignore[arg-type]
        try:
            super().visit(node)
        finally:
            if inner:
                self.statements.pop()

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
        """Record ``node`` as ``path:function: statement`` (its statement's text, one line) and
        why, so that the allowed list names statements, not lines that move."""
        statement = " ".join(ast.unparse(self.statements[-1]).split()) if self.statements \
            else ast.unparse(node)
        where = f"{self.path.relative_to(SOURCE.parent)}:{self.function}: {statement}"
        self.found.append((where, f"line {node.lineno}: {why}"))  # type: ignore[attr-defined]

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


def violations(path: Path) -> list[tuple[str, str]]:
    text = path.read_text()
    if not SQL.search(text):  # no string of the file can read as SQL: nothing to parse
        return []
    scope = _Scope(path)
    scope.visit(ast.parse(text, str(path)))
    return scope.found


@functools.cache
def _package_violations() -> tuple[tuple[str, str], ...]:
    """Every flagged statement of the package (scanned once for the tests below)."""
    return tuple(found for path in sorted(SOURCE.rglob("*.py")) for found in violations(path))


def fingerprint(statement: str) -> str:
    """A reviewed statement's key: a hash of its text as the AST prints it (layout and
    comments do not change it; any change to the code does)."""
    return hashlib.sha256(statement.encode()).hexdigest()[:12]


# Statements that put text chosen by code (never input) into SQL, each reviewed, keyed
# path:function:fingerprint. The list is closed: a new statement that builds SQL from a value, or
# a reviewed one changed, fails the test (which prints its text and key) until it is looked at.
_STREAM = "`_stream_filter`'s literal clauses with '?' placeholders"
REVIEWED = {
    # one '?' per claimed row id
    "rlmon/service/alerting/notify/outbox.py:_due:630cef755f34": "'?' per claimed row",
    "rlmon/service/alerting/notify/outbox.py:next_due:39736391c1c4": "'?' per claimed row",
    # the migrations: table names from a literal tuple, checked against the code's schema and
    # quoted; the file's column names likewise (a name the code's schema lacks is refused)
    "rlmon/service/storage/history.py:_add_attempts:47dbf196bc77": "quoted code table names",
    "rlmon/service/storage/history.py:_add_attempts:9aa026f24f49": "a CREATE from _SCHEMA",
    "rlmon/service/storage/history.py:_add_attempts:e7d7a0c82fd9": "checked, quoted columns",
    "rlmon/service/storage/history.py:_add_attempts:37d0f4b413f1": "quoted code table name",
    "rlmon/service/storage/history.py:_add_columns:96d2d655a350": "code columns, quoted",
    # the catalog's key-curve names (code constants) in the back-fill's JSON paths
    "rlmon/service/storage/history.py:_fill_curve_rows:2dbdfa6f1eb3": "catalog names",
    "rlmon/service/storage/history.py:_fill_curve_rows:dd5770530b01": "catalog names",
    "rlmon/service/storage/history.py:alert_states:685e19bb92ea": "literal columns; " + _STREAM,
    "rlmon/service/storage/history.py:last_steps:454f42291bdd": _STREAM,
    "rlmon/service/storage/history.py:latest_attempts:f23db89b9250": _STREAM,
    "rlmon/service/storage/history.py:steps:ec13bd5cdd2c": "literal clauses, '?' placeholders",
    "rlmon/service/storage/history.py:steps:5ebe2eb3b432": "literal clauses, '?' placeholders",
    "rlmon/service/storage/history.py:curve_values:bdda163ea9ea": "a literal clause",
    "rlmon/service/storage/history.py:curve_values:958a63c5e2c6": "a literal clause",
    "rlmon/service/storage/history.py:samples:d374c6a56b98": "literal clauses",
    "rlmon/service/storage/history.py:samples:8062616aca8c": "literal clauses",
    "rlmon/service/storage/history.py:alerts:bd419f8d1453": "literal columns; " + _STREAM,
    "rlmon/service/storage/history.py:stops:facd9ccf4e2d": _STREAM,
    "rlmon/service/storage/history.py:liveness:aef5233d7062": _STREAM,
    "rlmon/service/storage/history.py:prune:af035523f5e9": "a literal clause",
    "rlmon/service/storage/history.py:prune:633b82c80790": "a literal clause",
    "rlmon/service/storage/history.py:prune:6bb557c71fd0": "a literal clause",
    "rlmon/service/storage/history.py:prune:25d13b9dd43e": "a literal clause",
}


def _key(where: str) -> str:
    path_function, statement = where.split(": ", 1)
    return f"{path_function}:{fingerprint(statement)}"


def test_no_sql_text_is_built_from_a_value() -> None:
    found = [f"{_key(where)}  {where.split(': ', 1)[1]}  ({why})"
             for where, why in _package_violations() if _key(where) not in REVIEWED]
    assert found == []


def test_the_review_is_by_statement_and_every_entry_is_still_there() -> None:
    """A statement beside a reviewed one, in the same function, is not covered by it; an entry
    whose statement is gone is stale (a change made since the review)."""
    keys = {_key(w) for w, _ in _package_violations()}
    assert set(REVIEWED) - keys == set()
    code = ("def prune(self, older, args):\n"
            "    self._db.execute(f'DELETE FROM curve_rows WHERE {older}', args)\n"
            "    self._db.execute(f'DELETE FROM curve_rows WHERE {args}')\n")
    scope = _Scope(SOURCE / "service" / "storage" / "history.py")
    scope.visit(ast.parse(code))
    assert [_key(w) in REVIEWED for w, _ in scope.found] == [True, True, False, False]


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
