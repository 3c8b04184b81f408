"""Generated Prometheus rules: fresh on disk, valid for promtool, and unit-tested with promtool."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rlmon.service.alerting.rules import (
    default_rules,
    early_warning_rules,
    fixed_rules,
    parse_rules,
)
from rlmon.service.export import prometheus_rules as prom_rules
from rlmon.service.metrics import catalog
from tests.support.alerting_support import need_binary
from tests.support.paths import REPO

ROOT = REPO
RULES = ROOT / prom_rules.PROMETHEUS_RULES_PATH
OPERATOR = ROOT / prom_rules.PROMETHEUSRULE_PATH
RULES_TEST = ROOT / "dashboards" / "prometheus-rules.test.yaml"


def promtool(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([need_binary("promtool"), *args], capture_output=True, text=True,
                          cwd=cwd, timeout=60, check=False)


def test_checked_in_files_are_fresh() -> None:
    for artifact in prom_rules.artifacts():
        current = (ROOT / artifact.path).read_text(encoding="utf-8")
        assert current == artifact.expected(current), f"{artifact.path} is stale: rlmon generate"


def test_for_and_keep_firing_follow_the_step_period() -> None:
    translated, skipped = prom_rules.translate(default_rules(), step_period=45)
    by_name = {r.alert: r for r in translated}
    # rlmon fires at the Nth bad step, (N-1) periods after the first: for = (N-1) x period
    assert by_name["ClipRatioHigh"].for_ == "1m30s"  # 3 steps: 2 x 45 s
    # resolves at the RESOLVE_AFTER-th (20th) good step: 19 x 45 s (hysteresis, issue 30)
    assert by_name["ClipRatioHigh"].keep_firing_for == "14m15s"
    assert by_name["RewardStuck"].for_ == "14m15s"  # 20 steps: 19 x 45 s
    assert by_name["ISRatioDivergence"].for_ is None
    assert by_name["ISRatioDivergence"].expr == (
        "rlmon_actor_is_ratio < 0.5 or rlmon_actor_is_ratio > 2")
    assert by_name["RewardStuck"].expr == "abs(rlmon_rollout_reward) < 1e-09"
    # the early-warning rules keep per-run state PromQL cannot hold: left out, by name
    rlmon_only = [catalog.STRAGGLER_ALERT.name, "StageStuck", "StepTimeRegression"]
    assert skipped == rlmon_only + [r.name for r in early_warning_rules()]
    assert {r.name for r in fixed_rules()} - set(rlmon_only) == set(by_name)
    # the stall is judged by Prometheus from the exported step time and threshold
    assert by_name["RunStalled"].expr.startswith(
        "time() - rlmon_last_step_timestamp_seconds > rlmon_stall_threshold_seconds")


def test_rules_promql_cannot_express_are_listed() -> None:
    rules = parse_rules("rules:\n  - {name: LossFlat, severity: warning, condition: stuck, "
                        "metric: actor/loss, window: 5}\n")
    text = prom_rules.render(rules)
    assert "# Not expressible in PromQL (evaluated by rlmon only): LossFlat" in text
    assert "alert: LossFlat" not in text


def test_early_warning_rules_are_left_out_with_the_reason() -> None:
    text = prom_rules.render()
    names = [r.name for r in early_warning_rules()]
    assert "PromQL has no per-run step state" in text
    assert "# out rather than approximated: " + ", ".join(names) in text
    assert not any(f"alert: {name}" in text for name in names)
    assert "Not expressible in PromQL" not in text  # every other default rule is translated


def test_promtool_checks_both_formats(tmp_path: Path) -> None:
    out = promtool("check", "rules", str(RULES))
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(fixed_rules()) - 1} rules found" in out.stdout  # not StragglerRank
    operator = yaml.safe_load(OPERATOR.read_text())
    assert operator["kind"] == "PrometheusRule"
    groups = tmp_path / "groups.yaml"
    groups.write_text(yaml.safe_dump({"groups": operator["spec"]["groups"]}))
    out = promtool("check", "rules", str(groups))
    assert out.returncode == 0, out.stdout + out.stderr


def test_prometheusrule_matches_the_crd_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((ROOT / "tests" / "data" / "crds" / "PrometheusRule.json").read_text())
    schema = schema.get("openAPIV3Schema", schema)
    jsonschema.Draft7Validator(schema).validate(yaml.safe_load(OPERATOR.read_text()))


def test_promtool_unit_tests_pass_and_can_fail(tmp_path: Path) -> None:
    out = promtool("test", "rules", str(RULES_TEST))
    assert out.returncode == 0, out.stdout + out.stderr
    # the same tests against rules with a wrong threshold must fail
    shutil.copy(RULES_TEST, tmp_path / RULES_TEST.name)
    broken = RULES.read_text().replace("rlmon_actor_clip_ratio > 0.3", "rlmon_actor_clip_ratio > 0.6")
    (tmp_path / RULES.name).write_text(broken)
    out = promtool("test", "rules", str(tmp_path / RULES_TEST.name))
    assert out.returncode == 1
    assert "ClipRatioHigh" in out.stdout + out.stderr


def test_rules_export_command(tmp_path: Path) -> None:
    target = tmp_path / "rules.yaml"
    cmd = [sys.executable, "-m", "rlmon", "rules", "export", "--format", "prometheusrule",
           "--step-period", "10", "-o", str(target)]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    doc = yaml.safe_load(target.read_text())
    rules = {r["alert"]: r for r in doc["spec"]["groups"][0]["rules"]}
    assert rules["EntropyCollapse"]["for"] == "20s"  # 3 steps at 10 s: 2 periods
    assert doc["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert rules["EntropyCollapse"]["labels"]["severity"] == "critical"
    default = subprocess.run([sys.executable, "-m", "rlmon", "rules", "export"],
                             capture_output=True, text=True, cwd=ROOT, timeout=60, check=False)
    assert default.stdout == RULES.read_text()


def test_release_label_is_configurable_and_documented(tmp_path: Path) -> None:
    operator = yaml.safe_load(OPERATOR.read_text())
    assert operator["metadata"]["labels"]["release"] == prom_rules.DEFAULT_RELEASE
    assert "release" in OPERATOR.read_text().split("apiVersion:")[0]  # the header says why
    named = yaml.safe_load(prom_rules.render(fmt="prometheusrule", release="prom"))
    assert named["metadata"]["labels"]["release"] == "prom"
    bare = prom_rules.render(fmt="prometheusrule", release="")
    assert "release" not in yaml.safe_load(bare)["metadata"]["labels"]
    assert "ruleSelectorNilUsesHelmValues" in bare
    target = tmp_path / "rule.yaml"
    done = subprocess.run(
        [sys.executable, "-m", "rlmon", "rules", "export", "--format", "prometheusrule",
         "--release", "monitoring-stack", "-o", str(target)],
        capture_output=True, text=True, cwd=ROOT, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(target.read_text())["metadata"]["labels"]["release"] == (
        "monitoring-stack")


def test_single_step_rules_have_no_for() -> None:
    translated, _ = prom_rules.translate(default_rules(), step_period=60)
    by_name = {r.alert: r for r in translated}
    single = [r for r in fixed_rules() if r.for_steps == 1]
    assert single
    for rule in single:
        if rule.name in by_name:  # StageStuck, StepTimeRegression: rlmon only
            assert by_name[rule.name].for_ is None, rule.name


def test_rules_export_reads_only_its_section_of_a_deployment_config(tmp_path: Path) -> None:
    """The deployment's config points at secret files that exist in the pod, not where the rules
    are exported; export uses prometheus_rules and validates that section alone."""
    config = tmp_path / "rlmon.yaml"
    config.write_text(yaml.safe_dump({
        "notifiers": {"slack": {"webhook_url_file": str(tmp_path / "absent" / "slack")}},
        "prometheus_rules": {"step_period_seconds": 10}}))

    def export(path: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "rlmon", "rules", "export", "--config",
                               str(path)], capture_output=True, text=True, cwd=ROOT, timeout=60,
                              check=False)

    done = export(config)
    assert done.returncode == 0, done.stderr
    rules = {r["alert"]: r for r in yaml.safe_load(done.stdout)["groups"][0]["rules"]}
    assert rules["EntropyCollapse"]["for"] == "20s"  # the config's 10 s step period
    # the section it uses is still checked, and a misspelt section still fails
    config.write_text(yaml.safe_dump({"prometheus_rules": {"step_period_seconds": -1}}))
    bad = export(config)
    assert bad.returncode == 2 and "prometheus_rules.step_period_seconds" in bad.stderr
    config.write_text(yaml.safe_dump({"prometheus_rule": {"step_period_seconds": 10}}))
    typo = export(config)
    assert typo.returncode == 2 and "prometheus_rule" in typo.stderr
