"""The generated Grafana dashboards: current on disk, built from the catalog, well-formed for
Grafana 11 (schemaVersion 41), thresholds equal to the catalog's alert levels, and every PromQL
expression parsed by promtool.

The check that every expression names only series a live exporter serves is in
``test_dashboards_live.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlmon.cli import main
from rlmon.service import generated
from rlmon.service.dashboards import DASHBOARDS, model, render
from rlmon.service.dashboards import overview as overview_mod
from rlmon.service.dashboards import rollout as rollout_mod
from rlmon.service.dashboards.artifacts import artifacts, chart_path
from rlmon.service.dashboards.panels import catalog_rows
from rlmon.service.dashboards.thresholds import Band, alert_bands
from rlmon.service.metrics import catalog
from rlmon.service.metrics.spec import AlertSpec, Comparison, Severity
from tests.support.paths import REPO
from tests.support.promql_names import metric_names

ROOT = REPO
MODELS = {d.uid: model(d) for d in DASHBOARDS}


def panels(dash: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for p in dash["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))
    return out


def exprs(dash: dict[str, Any]) -> list[str]:
    found = [t["expr"] for p in panels(dash) for t in p.get("targets", [])]
    found += [a["expr"] for a in dash["annotations"]["list"] if "expr" in a]
    return found


def panel_of(dash: dict[str, Any], series: str) -> dict[str, Any]:
    hits = [p for p in panels(dash)
            if any(series in metric_names(t["expr"]) for t in p.get("targets", []))]
    assert hits, f"no panel draws {series}"
    return hits[0]


# --- files on disk ----------------------------------------------------------------------------


def test_checked_in_dashboards_are_current() -> None:
    for dash in DASHBOARDS:
        assert (ROOT / dash.path).read_text(encoding="utf-8") == render(dash), (
            f"{dash.path} is stale: run `rlmon dashboards build`")
    assert main(["dashboards", "build", "--root", str(ROOT), "--check"]) == 0
    assert not [p for p in generated.stale(ROOT) if p.startswith(("dashboards/", "helm/"))]


def test_build_writes_and_check_detects_staleness(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dashboards", "build", "--root", str(tmp_path), "--check"]) == 1
    assert main(["dashboards", "build", "--root", str(tmp_path)]) == 0
    for art in artifacts():
        assert (tmp_path / art.path).exists(), art.path
    assert main(["dashboards", "build", "--root", str(tmp_path), "--check"]) == 0
    first = tmp_path / DASHBOARDS[0].path
    first.write_text(first.read_text().replace('"schemaVersion": 41', '"schemaVersion": 40'))
    capsys.readouterr()
    assert main(["dashboards", "build", "--root", str(tmp_path), "--check"]) == 1
    assert DASHBOARDS[0].path in capsys.readouterr().err


def test_chart_carries_copies_of_every_dashboard_and_rule_file() -> None:
    paths = {a.path for a in artifacts()}
    for dash in DASHBOARDS:
        assert chart_path(dash.path) in paths
    rule_files = [a for a in generated.all_artifacts()
                  if a.path.startswith("dashboards/") and a.path.endswith(".yaml")
                  and "groups" in (yaml.safe_load(a.render()) or {})]
    assert rule_files, "no generated Prometheus rule file under dashboards/"
    for art in rule_files:
        assert chart_path(art.path) in paths
        assert (ROOT / chart_path(art.path)).read_bytes() == (ROOT / art.path).read_bytes()


# --- structure ----------------------------------------------------------------------------------


def test_grafana_11_model_basics() -> None:
    uids = [d.uid for d in DASHBOARDS]
    assert len(set(uids)) == len(uids) == 3
    for uid, dash in MODELS.items():
        assert dash["uid"] == uid
        assert dash["schemaVersion"] == 41
        assert "rlmon" in dash["tags"]
        ids = [p["id"] for p in panels(dash)]
        assert len(ids) == len(set(ids))
        assert 0 not in ids
        names = [v["name"] for v in dash["templating"]["list"]]
        assert names[:3] == ["datasource", "run", "role"]
        for p in panels(dash):
            if p["type"] == "row":
                continue
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
            assert p["targets"], p["title"]
            assert p["gridPos"]["x"] >= 0
            assert p["gridPos"]["x"] + p["gridPos"]["w"] <= 24


def test_overview_draws_what_the_issue_lists() -> None:
    dash = MODELS[overview_mod.UID]
    for name in ("rollout/reward", "rollout/response_length", "rollout/clipped_ratio",
                 "actor/kl", "actor/entropy", "actor/clip_ratio", "actor/logp_diff",
                 "actor/grad_norm", "actor/loss", "perf/step_seconds"):
        panel_of(dash, catalog.get(name).prometheus_name)
    # IS ratio mean, min and max on one chart, with ISRatioDivergence's levels drawn
    is_panel = panel_of(dash, catalog.get("actor/is_ratio").prometheus_name)
    drawn = {n for t in is_panel["targets"] for n in metric_names(t["expr"])}
    assert drawn == {catalog.get(n).prometheus_name
                     for n in ("actor/is_ratio", "actor/is_ratio_min", "actor/is_ratio_max")}
    steps = is_panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert [(s["value"], s["color"]) for s in steps] == [
        (None, "red"), (0.1, "red"), (0.5, "green"), (2.0, "red")]  # ISRatioStale at 0.1
    assert is_panel["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"]["mode"] == "line+area"
    # ranks reporting against expected, and firing alerts
    ranks = panel_of(dash, "rlmon_ranks_reporting")
    assert {n for t in ranks["targets"] for n in metric_names(t["expr"])} == {
        "rlmon_ranks_reporting", "rlmon_ranks_expected"}
    tables = [p for p in panels(dash) if p["type"] == "table"
              and "rlmon_alert_firing" in metric_names(p["targets"][0]["expr"])]
    assert tables
    assert tables[0]["targets"][0]["format"] == "table"


def test_every_catalog_metric_is_drawn_on_its_dashboard() -> None:
    assert set(catalog_rows("overview")) == set(overview_mod.ROWS)
    assert set(catalog_rows("rollout")) == set(rollout_mod.ROWS)
    where = {"overview": overview_mod.UID, "rollout": rollout_mod.UID}
    for spec in catalog.metrics():
        dash = MODELS[where[spec.panel.dashboard]]
        drawn = {n for e in exprs(dash) for n in metric_names(e)}
        assert spec.prometheus_name in drawn, spec.name


def test_thresholds_come_from_the_catalog() -> None:
    dash = MODELS[overview_mod.UID]
    for spec in catalog.metrics():
        if spec.panel.dashboard != "overview" or not spec.alerts:
            continue
        panel = panel_of(dash, spec.prometheus_name)
        steps = panel["fieldConfig"]["defaults"].get("thresholds", {}).get("steps", [])
        for alert in spec.alerts:
            if alert.comparison is Comparison.ABS_LT:
                continue
            levels = {alert.threshold} | ({alert.high} if alert.comparison is
                                          Comparison.OUTSIDE else set())
            assert levels <= {s["value"] for s in steps}, (spec.name, alert.name, steps)
    # a metric with a healthy range and no alert gets dashed advisory bands
    approx_kl = panel_of(dash, catalog.get("actor/approx_kl").prometheus_name)
    assert approx_kl["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"]["mode"] == "dashed"


def test_alert_bands_compose_levels() -> None:
    warn = AlertSpec("W", Severity.WARNING, Comparison.GT, 0.1)
    crit = AlertSpec("C", Severity.CRITICAL, Comparison.GT, 1.0)
    assert alert_bands([warn, crit]) == [Band(None, "green"), Band(0.1, "orange"),
                                         Band(1.0, "red")]
    low = AlertSpec("L", Severity.CRITICAL, Comparison.LT, 0.01)
    assert alert_bands([low]) == [Band(None, "red"), Band(0.01, "green")]
    outside = AlertSpec("O", Severity.CRITICAL, Comparison.OUTSIDE, 0.5, 2.0)
    stale = AlertSpec("S", Severity.WARNING, Comparison.LT, 0.1)
    assert alert_bands([outside, stale]) == [Band(None, "red"), Band(0.1, "red"),
                                             Band(0.5, "green"), Band(2.0, "red")]
    assert alert_bands([AlertSpec("Z", Severity.WARNING, Comparison.ABS_LT, 1e-9)]) == []


def test_alert_annotations_and_variables() -> None:
    for dash in MODELS.values():
        (anno,) = [a for a in dash["annotations"]["list"] if a["name"] == "rlmon alerts"]
        assert metric_names(anno["expr"]) == {"rlmon_alert_firing"}
        assert anno["titleFormat"] == "{{alert}}"
        assert "severity" in anno["tagKeys"]
        assert anno["datasource"]["uid"] == "${datasource}"
        assert anno["enable"] is True
        variables = {v["name"]: v for v in dash["templating"]["list"]}
        assert variables["run"]["query"] == "label_values(rlmon_step, run)"
        assert variables["role"]["multi"]
        assert variables["role"]["includeAll"]
        for e in exprs(dash):
            run_level = ("rlmon_run_info", "rlmon_goodput_mfu")  # one series per run
            if "rlmon_" in e and "{" in e and "instance" not in e and not any(
                    name in e for name in run_level):
                assert 'run=~"$run"' in e, e
                assert 'role=~"$role"' in e, e


def test_metric_names_parser() -> None:
    e = ('sum by (run, role) (rate(rlmon_a_total{run=~"$run", x="sum(y)"}[$__rate_interval])) '
         '/ on(run) group_left rlmon_b > 1e-9 or vector(0) unless count(rlmon_c offset 5m)')
    assert metric_names(e) == {"rlmon_a_total", "rlmon_b", "rlmon_c"}


# --- PromQL -------------------------------------------------------------------------------------


def test_rendered_json_is_deterministic() -> None:
    for dash in DASHBOARDS:
        text = render(dash)
        assert text == render(dash)
        assert text.endswith("\n")
        assert json.loads(text) == MODELS[dash.uid]
