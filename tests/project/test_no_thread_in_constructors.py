"""No constructor in rlmon/service starts a thread or a server: the stages, sinks and servers
there start them in ``start()``, which the Ray actors and ``rlmon serve`` call (docs/design.md,
"The spine"). tests/unit/service/test_constructors_start_nothing.py builds each and checks the
same at run time; this check also sees a class no test builds."""

from __future__ import annotations

import ast
from pathlib import Path

import rlmon

SERVICE = Path(rlmon.__file__).parent / "service"
# what starts a thread or a server (or makes a thread to start)
STARTERS = {"start", "Thread", "Timer", "serve_metrics", "make_server", "start_http_server",
            "serve_forever"}


def starters_in_constructors(source: str) -> list[str]:
    """``Class.__init__:line: call`` for each call of a starter in a constructor of
    ``source``."""
    found = []
    for cls in [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef)]:
        for init in cls.body:
            if not (isinstance(init, ast.FunctionDef) and init.name == "__init__"):
                continue
            for node in ast.walk(init):
                if isinstance(node, ast.Call):
                    func = node.func
                    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                    if name in STARTERS:
                        found.append(f"{cls.name}.__init__:{node.lineno}: {ast.unparse(func)}")
    return found


def test_the_check_finds_a_thread_started_by_a_constructor() -> None:
    source = ("import threading\n"
              "class Server:\n"
              "    def __init__(self):\n"
              "        self._thread = threading.Thread(target=print)\n"
              "        self._thread.start()\n"
              "    def start(self):\n"
              "        self._thread.start()\n")
    assert starters_in_constructors(source) == [
        "Server.__init__:4: threading.Thread", "Server.__init__:5: self._thread.start"]


def test_no_constructor_in_the_service_starts_a_thread_or_a_server() -> None:
    offenders = [f"{path.relative_to(SERVICE.parent)}: {hit}"
                 for path in sorted(SERVICE.rglob("*.py"))
                 for hit in starters_in_constructors(path.read_text(encoding="utf-8"))]
    assert offenders == []
