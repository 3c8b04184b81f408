"""``rlmon diagnose`` as users run it: the terminal summary, --json, --html (rendered in a
headless browser: tests/integration/test_diagnose_page.py), --rules, --fail-on and the exit
codes, and the errors for bad input."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from rlmon.service.metrics.catalog import RESOLVE_AFTER
from tests.support.cli import run_rlmon
from tests.support.diagnose_support import trl_curves
from tests.unit.diagnose.test_diagnose_trainer_state import write_state


def rlmon(*args: str) -> subprocess.CompletedProcess[str]:
    return run_rlmon("diagnose", *args)


def test_terminal_summary_names_the_finding_and_its_context(tmp_path: Path) -> None:
    state = write_state(tmp_path / "trainer_state.json", trl_curves(fault="nan", at=25))
    out = rlmon(str(state))
    assert out.returncode == 0, out.stderr
    assert "framework: trl (detected from its keys)" in out.stdout
    assert "CRITICAL NonFiniteMetric at step 25: actor/grad_norm (grad_norm) = NaN" in out.stdout
    assert "grad_norm: 22: 10, 23: 100, 24: 1000, 25: NaN" in out.stdout
    assert "unknown: rewards/accuracy/mean" in out.stdout
    assert "reduced lossily by the framework" in out.stdout


def test_json_has_one_finding_per_alert_transition(tmp_path: Path) -> None:
    rows = trl_curves(steps=60, fault="tied_rewards", at=25)
    for step in range(30, 61):  # the ties end: the alert resolves at the RESOLVE_AFTER-th good step
        rows[step]["frac_reward_zero_std"] = 0.0
    state = write_state(tmp_path / "trainer_state.json", rows)
    out = rlmon(str(state), "--json")
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert lines[0]["type"] == "source" and lines[0]["framework"] == "trl"
    findings = [(f["step"], f["alert"], f["severity"], f["state"], f["metric"], f["value"])
                for f in lines[1:] if f["alert"] == "NoLearningSignal"]
    assert findings == [
        (27, "NoLearningSignal", "critical", "firing", "rollout/frac_reward_zero_std", 1.0),
        (30 + RESOLVE_AFTER - 1, "NoLearningSignal", "critical", "resolved",
         "rollout/frac_reward_zero_std", 0.0)]
    summary = json.loads(out.stderr.splitlines()[-1])
    assert summary["type"] == "summary" and summary["critical"] >= 1


def test_fail_on_gates_a_ci_job(tmp_path: Path) -> None:
    bad = write_state(tmp_path / "bad" / "trainer_state.json",
                      trl_curves(fault="entropy_collapse", at=25))
    good = write_state(tmp_path / "good" / "trainer_state.json", trl_curves())
    assert rlmon(str(bad), "--fail-on", "critical").returncode == 1
    assert rlmon(str(good), "--fail-on", "critical").returncode == 0
    assert rlmon(str(bad), "--fail-on", "warning").returncode == 1


def test_rules_backtests_a_teams_own_pack(tmp_path: Path) -> None:
    state = write_state(tmp_path / "trainer_state.json", trl_curves())
    rules = tmp_path / "rules.yaml"
    rules.write_text("rules:\n  - name: EntropyBelow\n    severity: warning\n"
                     "    condition: threshold\n    metric: actor/entropy\n    op: '<'\n"
                     "    threshold: 1.9\n    for: 2\n")
    out = rlmon(str(state), "--rules", str(rules), "--json", "--fail-on", "warning")
    assert out.returncode == 1
    first = next(json.loads(line) for line in out.stdout.splitlines()
                 if json.loads(line).get("alert") == "EntropyBelow")
    entropy = {s: v["entropy"] for s, v in trl_curves().items()}
    below = [s for s in sorted(entropy) if entropy[s] < 1.9]
    assert first["since"] == next(s for s in below if s + 1 in below)
    assert first["step"] == first["since"] + 1
    tested = [json.loads(line) for line in out.stderr.splitlines()
              if json.loads(line)["type"] == "backtest" and json.loads(line)["rule"] ==
              "EntropyBelow"]
    assert [t["fired"][0][0] for t in tested] == [first["step"]]  # as replay --rules says it
    table = rlmon(str(state), "--rules", str(rules))
    assert "rule backtest: steps fired-resolved" in table.stdout
    assert "EntropyBelow" in table.stdout.split("rule backtest")[1]
    bad_rules = tmp_path / "bad.yaml"
    bad_rules.write_text("rules:\n  - name: X\n    severity: loud\n")
    out = rlmon(str(state), "--rules", str(bad_rules))
    assert out.returncode == 2 and "rules[0] (X)" in out.stderr


def test_bad_input_is_named_and_the_rest_diagnosed(tmp_path: Path) -> None:
    good = write_state(tmp_path / "trainer_state.json", trl_curves(fault="nan", at=25))
    notes = tmp_path / "notes.txt"
    notes.write_text("just text\n")
    nothing_known = tmp_path / "mine.jsonl"
    nothing_known.write_text("".join(json.dumps({"_step": s, "foo": 1.0}) + "\n"
                                     for s in range(5)))
    out = rlmon(str(good), str(notes), str(tmp_path / "missing"), str(nothing_known),
                "--fail-on", "critical")
    assert out.returncode == 1  # the verdict on what was read wins
    assert "Traceback" not in out.stderr
    assert f"{notes}: format not recognised; expected a TensorBoard" in out.stderr
    assert f"{tmp_path / 'missing'}: no such file or directory" in out.stderr
    assert f"{nothing_known}: no key rlmon knows among its 2 keys" in out.stderr
    assert "NonFiniteMetric" in out.stdout
    assert rlmon(str(good), str(notes)).returncode == 2
