"""Escalations and severity that say what happened (issue 39), in ``rlmon diagnose`` on a
``trainer_state.json`` written by transformers (150 steps of 20 s): an escalated alert quotes the
critical level and the step it was first crossed, is one incident priced once, says "escalated
from warning"; a warning handed over to its level rule says so; an entropy collapse of 97 % of
its own baseline and a length pinned at its 1,024-token cap are critical; the TRL settings to
change and what moved first are printed."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from rlmon.service.diagnose.findings import Diagnosis, Finding, diagnose
from rlmon.service.diagnose.formats import read_paths
from tests.support.cli import run_rlmon
from tests.unit.diagnose.test_diagnose_trainer_state import write_state

STEPS = 150


def blow_up(seed: int = 0) -> dict[int, dict[str, float]]:
    """TRL's keys; from step 50 the KL grows x1.15 and the gradient norm x1.12 a step, from 60
    the entropy falls from 0.45 towards 0.0119 (97 % of its own level, never under 0.01)."""
    rng = np.random.default_rng(seed)
    rows = {}
    for step in range(1, STEPS + 1):
        entropy = 0.45 if step < 60 else max(0.0119, 0.45 * 0.9 ** (step - 60))
        rows[step] = {
            "reward": 0.3 + 0.001 * step + 0.02 * rng.standard_normal(),
            "completions/mean_length": 300 * math.exp(0.02 * rng.standard_normal()),
            "kl": 0.02 * 1.15 ** max(0, step - 50) * math.exp(0.03 * rng.standard_normal()),
            "grad_norm": 1.12 ** max(0, step - 50) * math.exp(0.05 * rng.standard_normal()),
            "entropy": entropy * math.exp(0.02 * rng.standard_normal()),
            "loss": 0.01 * rng.standard_normal(), "learning_rate": 1e-6, "step_time": 20.0}
    return rows


def pinned_at_cap(seed: int = 1) -> dict[int, dict[str, float]]:
    """The mean completion length runs away from step 60 (x1.04 a step) into its 1,024 cap."""
    rng = np.random.default_rng(seed)
    return {step: {
        "reward": 0.3 + 0.02 * rng.standard_normal(),
        "completions/mean_length": min(1024.0, 300 * 1.04 ** max(0, step - 60)
                                       * math.exp(0.02 * rng.standard_normal())),
        "kl": 0.02 * math.exp(0.05 * rng.standard_normal()),
        "entropy": 0.4 * math.exp(0.02 * rng.standard_normal()),
        "grad_norm": 1.0, "loss": 0.0, "learning_rate": 1e-6, "step_time": 20.0}
        for step in range(1, STEPS + 1)}


def _diagnose(tmp_path: Path, rows: dict[int, dict[str, float]]) -> tuple[Diagnosis, Path]:
    path = write_state(tmp_path / "trainer_state.json", rows)
    (run,), problems = read_paths([path])
    assert problems == []
    return diagnose(run, gpus=8, price=2.5), path


def _of(d: Diagnosis, alert: str, state: str = "firing") -> list[Finding]:
    return [f for f in d.findings if f.alert == alert and f.state == state]


@pytest.mark.parametrize(("alert", "metric", "level"),
                         [("KLDivergence", "kl", 10.0), ("GradNormHigh", "grad_norm", 1000.0)])
def test_an_escalation_quotes_the_critical_level_and_the_step_it_was_crossed(
        tmp_path: Path, alert: str, metric: str, level: float) -> None:
    d, _ = _diagnose(tmp_path, blow_up())
    warning, critical = _of(d, alert)
    assert warning.severity == "warning" and not warning.escalated_from
    assert critical.severity == "critical" and critical.escalated_from == "warning"
    assert critical.condition == f"{critical.metric} > {level:g} (the critical level)"
    rows = blow_up()
    first_over = min(s for s, v in rows.items() if v[metric] > level)
    assert critical.since == critical.step == first_over
    assert rows[critical.since - 1][metric] <= level  # not a step under the level
    assert warning.escalated_at == critical.step and warning.severity_now == "critical"


def test_an_escalation_is_one_incident_priced_once(tmp_path: Path) -> None:
    d, _ = _diagnose(tmp_path, blow_up())
    assert d.clock is not None
    total = d.clock.gpu_hours(d.clock.total_seconds)
    assert total is not None and math.isclose(total, 150 * 20 * 8 / 3600)
    for alert in ("KLDivergence", "GradNormHigh"):
        warning, critical = _of(d, alert)
        assert critical.cost is None
        assert warning.cost is not None and warning.cost.last == STEPS  # to the run's end
        assert (warning.cost.gpu_hours or 0) <= total


def test_a_handed_over_warning_is_not_a_plain_resolve(tmp_path: Path) -> None:
    d, _ = _diagnose(tmp_path, blow_up())
    (handed,) = _of(d, "KLClimbing", "resolved")
    assert handed.handed_to == "KLDivergence"
    (fired,) = _of(d, "KLDivergence")[:1]
    assert handed.step == fired.step


def test_an_entropy_collapse_of_97_percent_of_its_baseline_is_critical(tmp_path: Path) -> None:
    d, _ = _diagnose(tmp_path, blow_up())
    assert _of(d, "EntropyCollapse") == []  # it never crossed 0.01
    warning, critical = _of(d, "EntropySliding")
    assert warning.severity == "warning" and warning.escalated_at == critical.step
    assert critical.severity == "critical" and critical.escalated_from == "warning"
    assert "90% below its own pre-onset level" in critical.condition
    assert critical.value is not None and critical.value > 0.01
    assert critical.value <= 0.1 * 0.45 * 1.1


def test_a_length_pinned_at_its_cap_is_critical_and_names_the_cap(tmp_path: Path) -> None:
    d, _ = _diagnose(tmp_path, pinned_at_cap())
    warning, critical = _of(d, "ResponseLengthRunaway")
    assert warning.what_to_check and "cap" in warning.what_to_check
    assert critical.severity == "critical" and critical.value == 1024.0
    assert "pinned at its cap" in critical.condition and "1024" in critical.condition
    rows = pinned_at_cap()
    assert critical.since == min(s for s, v in rows.items()
                                 if v["completions/mean_length"] == 1024.0)


def test_diagnose_prints_the_story_and_what_to_change_for_trl(tmp_path: Path) -> None:
    _, path = _diagnose(tmp_path, blow_up())
    out = run_rlmon("diagnose", str(path), "--gpus", "8",
                    "--price-per-gpu-hour", "2.5")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "CRITICAL KLDivergence at step" in text
    line = next(x for x in text.splitlines() if "CRITICAL KLDivergence" in x)
    assert "(escalated from warning, first past the critical level at step" in line
    assert "actor/kl > 10 (the critical level)" in line and "> 2 for 3 steps" not in line
    assert "escalated from warning: the same incident" in text
    assert "KLClimbing handed over at step" in text and "to KLDivergence" in text
    assert "KLClimbing resolved" not in text
    assert "TRL: raise `beta`" in text  # what to change, in the detected framework's keys
    assert "severity now: critical (escalated at step" in text
    assert "what moved first:" in text
    assert "0 warning findings" not in text and "critical, " in text


def _without_time(tmp_path: Path) -> Path:
    """The blow-up's trainer_state.json with nothing that says how long a step took: no
    step_time and, as a checkpoint's state has none, no closing train_runtime."""
    path = write_state(tmp_path / "trainer_state.json",
                       {s: {k: v for k, v in row.items() if k != "step_time"}
                        for s, row in blow_up().items()})
    state = json.loads(path.read_text())
    state["log_history"] = [e for e in state["log_history"] if "train_runtime" not in e]
    path.write_text(json.dumps(state))
    return path


def test_a_log_without_step_times_says_once_why_nothing_is_priced(tmp_path: Path) -> None:
    path = _without_time(tmp_path)
    out = run_rlmon("diagnose", str(path), "--gpus", "8",
                    "--price-per-gpu-hour", "2.5")
    assert out.returncode == 0, out.stderr
    lines = [x for x in out.stdout.splitlines() if "not priced" in x]
    assert len(lines) == 1 and "says nothing of time" in lines[0]
    assert "--gpus 8 and --price-per-gpu-hour 2.5 price nothing" in lines[0]
    assert "cost: steps" not in out.stdout


def test_a_logs_report_tells_the_same_story_as_diagnose(tmp_path: Path) -> None:
    """``rlmon report`` of a log: alerts priced as diagnose prices them (at the 8 GPUs given,
    once per incident), an escalated warning labelled as one, and no zero goodput block, "GPUs
    per rank: 1", "cost unknown" or empty slowest-ranks headings for what a log cannot know."""
    d, path = _diagnose(tmp_path, blow_up())
    out = run_rlmon("report", str(path), "--gpus", "8",
                    "--price-per-gpu-hour", "2.5")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for absent in ("Goodput n/a", "over 0 steps", "GPUs per rank", "cost unknown",
                   "Slowest ranks", "Slowest stages", "0 GPU-s"):
        assert absent not in text, absent
    assert text.count("no per-rank step timelines") == 1
    warning, critical = _of(d, "KLDivergence")
    assert warning.cost is not None
    line = next(x for x in text.splitlines() if x.strip().startswith("KLDivergence ["))
    assert f"[warning, escalated to critical at step {critical.step}]" in line
    assert f"step {warning.step} " in line and warning.cost.describe() in line
    # the early warning handed over to its level rule, as diagnose says it, not "resolved"
    handed = next(f for f in d.findings if f.alert == "KLClimbing" and f.state == "resolved")
    line = next(x for x in text.splitlines() if x.strip().startswith("KLClimbing ["))
    assert f"), handed over to KLDivergence at step {handed.step};" in line, line
    assert "resolved at step" not in line
    report = json.loads(run_rlmon("report", str(path), "--json").stdout.splitlines()[0])
    assert [a["handed_to"] for a in report["alerts"] if a["alert"] == "KLClimbing"] == [
        "KLDivergence"]
    drawn = {tuple(m) for c in report["curves"] for m in c["markers"]}
    assert (handed.step, "KLClimbing", "resolved") not in drawn  # no recovery to draw


def test_a_logs_report_says_once_why_nothing_is_priced(tmp_path: Path) -> None:
    """Not on every alert's line as well as at the end: once, in the report's notes."""
    path = _without_time(tmp_path)
    out = run_rlmon("report", str(path), "--gpus", "8", "--price-per-gpu-hour", "2.5")
    assert out.returncode == 0, out.stderr
    lines = [x for x in out.stdout.splitlines() if "not priced" in x]
    assert len(lines) == 1 and "says nothing of time" in lines[0], out.stdout
    alerts = out.stdout.split("Alerts (", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    assert len(alerts) >= 3 and all("not priced" not in x for x in alerts)
