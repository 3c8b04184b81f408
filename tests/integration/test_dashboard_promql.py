"""Every PromQL expression of the dashboards parses with the real promtool (Debian's prometheus)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.alerting_support import need_binary
from tests.unit.export.test_dashboards import MODELS, exprs

pytestmark = pytest.mark.integration

GRAFANA_VARS = {"$__rate_interval": "1m", "$__range": "1h", "$__interval": "30s"}


def _promql(expr: str) -> str:
    for var, value in GRAFANA_VARS.items():
        expr = expr.replace(var, value)
    return expr  # "$run" etc. only occur inside regex matchers, where they are literal text


def _check_rules(tmp_path: Path, expressions: list[str]) -> subprocess.CompletedProcess[str]:
    promtool = need_binary("promtool")
    rules = {"groups": [{"name": "dashboards", "rules": [
        {"record": f"rlmon:dashboard_expr_{i}", "expr": _promql(e)}
        for i, e in enumerate(expressions)]}]}
    path = tmp_path / "dashboard-exprs.yaml"
    path.write_text(yaml.safe_dump(rules, sort_keys=False))
    return subprocess.run([promtool, "check", "rules", str(path)], capture_output=True,
                          text=True, timeout=60, check=False)


@pytest.mark.integration
def test_every_expression_parses_with_promtool(tmp_path: Path) -> None:
    expressions = [e for dash in MODELS.values() for e in exprs(dash)]
    assert len(expressions) > 60
    done = _check_rules(tmp_path, expressions)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(expressions)} rules found" in done.stdout
    # the check can fail: a broken expression is caught
    broken = _check_rules(tmp_path, [expressions[0].replace(")", "", 1) + " +"])
    assert broken.returncode != 0
