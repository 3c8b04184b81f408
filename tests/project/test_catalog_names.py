"""No canonical metric name typed outside the catalog (issue 11).

``rlmon.service.metrics.catalog`` types each canonical name once, as a constant (``catalog.LOSS`` is
``"actor/loss"``); the workload, the commands, the key maps and the integrations refer to those
constants. A string literal spelling a canonical name anywhere else in ``rlmon/`` fails here, with
its file and line. Tests may keep literals: they pin the names from outside.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import rlmon
from rlmon.service.metrics import catalog

PACKAGE = Path(rlmon.__file__).parent
CATALOG_MODULE = PACKAGE / "service" / "metrics" / "catalog.py"
KEYMAPS_MODULE = PACKAGE / "service" / "metrics" / "keymaps.py"


def name_literals(source: str, *, framework_rows: bool = False) -> list[tuple[int, str]]:
    """(line, name) of every string literal in ``source`` spelling a canonical name, f-string
    parts included.

    With ``framework_rows`` (the key maps), a row's framework key, the second argument of
    ``_row(framework, key, canonical=..., ...)``, is not ours: it names the framework's own
    metric and stays a literal where it happens to spell a canonical name (verl logs
    ``actor/entropy``).
    """
    tree = ast.parse(source)
    exempt: set[int] = set()
    if framework_rows:
        exempt = {id(node.args[1]) for node in ast.walk(tree)
                  if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                  and node.func.id == "_row" and len(node.args) > 1}
    return sorted((node.lineno, node.value) for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str)
                  and node.value in catalog.CATALOG and id(node) not in exempt)


def test_no_canonical_name_literal_outside_the_catalog() -> None:
    offenders = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {name!r}"
        for path in sorted(PACKAGE.rglob("*.py")) if path != CATALOG_MODULE
        for line, name in name_literals(path.read_text(encoding="utf-8"),
                                        framework_rows=path == KEYMAPS_MODULE)
    ]
    assert not offenders, "canonical names typed outside rlmon/service/metrics/catalog.py (use the " \
        "catalog's constants):\n" + "\n".join(offenders)


def test_the_catalog_types_each_name_once() -> None:
    typed = Counter(name for _, name in name_literals(CATALOG_MODULE.read_text(encoding="utf-8")))
    assert {name: n for name, n in typed.items() if n != 1} == {}
    assert set(typed) == set(catalog.CATALOG)


def test_every_catalog_name_has_its_constant() -> None:
    for spec in catalog.metrics():
        section, rest = spec.name.split("/", 1)
        constant = ("CRITIC_" if section == "critic" else "") + rest.upper()
        assert getattr(catalog, constant, None) == spec.name, constant


def test_the_scan_catches_a_literal() -> None:
    source = '''
from rlmon.service.metrics import catalog

KEY_METRICS = (catalog.LOSS, "actor/kl")
partials = {"rollout/reward": {"sum": 1.0, "count": 1.0}}
label = f"{prefix}" "actor/entropy"
rep.record("actor/loss_typo", value=1.0)
spec = catalog.get("perf/step_seconds")
row = _row("verl", "actor/grad_norm", canonical="actor/lr")
'''
    found = [(4, "actor/kl"), (5, "rollout/reward"), (6, "actor/entropy"),
             (8, "perf/step_seconds"), (9, "actor/grad_norm"), (9, "actor/lr")]
    assert name_literals(source) == found
    # in the key maps, the framework's own key is exempt; the canonical argument is not
    assert name_literals(source, framework_rows=True) == [f for f in found
                                                          if f != (9, "actor/grad_norm")]
