"""The `rlmon` command: replay's contract on stdout/stderr and exit codes, catalog, generate."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from rlmon.service.alerting.rules import default_rules
from tests.support.cli import run_rlmon
from tests.support.paths import REPO

ROOT = REPO
EXAMPLE = ROOT / "rlmon" / "data" / "example_run.jsonl"


def rlmon(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return run_rlmon(*args, stdin=stdin)


def test_replay_json_follows_the_contract(tmp_path: Path) -> None:
    bad = tmp_path / "run.jsonl"
    good = EXAMPLE.read_text().splitlines()[:40]
    bad.write_text("\n".join([good[0], "{oops", *good[1:]]) + "\n")
    out = rlmon("replay", str(bad), "--json")
    assert out.returncode == 2
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert {line["type"] for line in lines} <= {"step", "alert"}
    step = next(line for line in lines if line["type"] == "step")
    assert set(step) >= {"run", "role", "step", "complete", "ranks_expected", "ranks_reporting",
                         "missing_ranks", "metrics"}
    errors = [json.loads(line) for line in out.stderr.splitlines()]
    assert errors[0] == {"type": "error", "line": 2, "error": errors[0]["error"]}
    assert "malformed JSON" in errors[0]["error"]


def test_demo_replays_the_bundled_run_and_shows_the_stale_rollout() -> None:
    """The bundled run is the demo's default fault (stale rollout weights from step 3): the
    trainer/rollout log-prob gap and the worst importance ratio cross their warning lines, and
    once its warm-up is over the lag rule sees the rollout's policy lag growing a step a step."""
    out = rlmon("replay", str(EXAMPLE), "--json")
    assert out.returncode == 0, out.stderr
    alerts = [json.loads(line) for line in out.stdout.splitlines() if '"alert"' in line]
    firings = [a for a in alerts if a["state"] == "firing"]
    firing = {a["alert"]: a for a in reversed(firings)}  # each alert's first firing
    assert set(firing) == {"LogprobMismatch", "ISRatioStale", "PolicyLagGrowing"}
    assert firing["PolicyLagGrowing"]["step"] > 20  # the early-warning rules' warm-up
    assert firing["LogprobMismatch"]["value"] > 0.1
    assert firing["ISRatioStale"]["value"] < 0.1
    assert {a["severity"] for a in firing.values()} == {"warning"}
    # issue 30: the growing gap escalates LogprobMismatch to critical (one escalation event,
    # past its critical level 0.3) at step 14; nothing resolves (20 good steps needed)
    later = [a for a in firings if a is not firing[a["alert"]]]
    assert [(a["alert"], a["severity"], a["step"]) for a in later] == [
        ("LogprobMismatch", "critical", 14)]
    assert later[0]["value"] > 0.3
    assert not [a for a in alerts if a["state"] == "resolved"]


def test_replay_table_output_and_stdin() -> None:
    out = rlmon("replay", "-", stdin=EXAMPLE.read_text())
    assert out.returncode == 0
    assert "ISRatioStale" in out.stdout


def test_catalog_formats() -> None:
    data = json.loads(rlmon("catalog", "--format", "json").stdout)
    names = {row["name"] for row in data}
    assert {"actor/loss", "actor/is_ratio", "rollout/tokens", "perf/step_seconds"} <= names
    assert "| `actor/is_ratio` |" in rlmon("catalog", "--format", "markdown").stdout
    assert "actor/is_ratio" in rlmon("catalog").stdout


def test_generated_files_are_current() -> None:
    out = rlmon("generate", "--check")
    assert out.returncode == 0, out.stderr


def test_rules_show_round_trips(tmp_path: Path) -> None:
    shown = rlmon("rules", "show")
    assert shown.returncode == 0
    for rule in default_rules():  # each rule under its condition in words, from its kind
        assert f"# {rule.name}: {rule.describe()} (" in shown.stdout
    path = tmp_path / "rules.yaml"
    path.write_text(shown.stdout)
    checked = rlmon("rules", "check", str(path))
    assert checked.returncode == 0
    assert f"{len(default_rules())} rules OK" in checked.stdout  # early-warning ones included
    path.write_text("rules: [{name: X}]")
    assert rlmon("rules", "check", str(path)).returncode == 2


def test_table_mode_sends_rejections_to_stderr(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(EXAMPLE.read_text().splitlines()[0] + "\n{oops\n")
    out = rlmon("replay", str(path))
    assert out.returncode == 2
    assert "line 2" in out.stderr
    assert "line 2" not in out.stdout


def test_rules_check_warns_about_metrics_outside_the_catalog(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text("rules: [{name: Typo, severity: warning, condition: threshold, "
                    "metric: actor/is_ratoi, op: '>', threshold: 2}]\n")
    out = rlmon("rules", "check", str(path))
    assert out.returncode == 0
    assert "'actor/is_ratoi' is not in the catalog" in out.stderr
