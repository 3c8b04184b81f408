"""``rlmon replay``'s text on the bundled example run (the demo's stale weights, recorded): the
escalation reads as one, and the closing line counts step lines, not steps, in words."""

from __future__ import annotations

from importlib import resources

import pytest

from rlmon.cli import main


def test_the_example_run_reads_as_it_happened(capsys: pytest.CaptureFixture[str]) -> None:
    example = resources.files("rlmon") / "data" / "example_run.jsonl"
    with resources.as_file(example) as path:
        assert main(["replay", str(path)]) == 0
    text = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
    assert "LogprobMismatch firing grpo-demo-0/actor step 7:" in text
    # the warning's incident raised to critical at step 14: not a second "firing"
    assert "LogprobMismatch escalated to critical grpo-demo-0/actor step 14:" in text
    assert "LogprobMismatch firing grpo-demo-0/actor step 14" not in text
    # 30 steps of the actor, the rollout and the reward: 90 step lines
    assert "1500 lines, 1500 accepted, 0 rejected, 0 duplicates, 0 late; 90 step lines (one per " \
        "run, role and step; 0 incomplete), 4 alert events" in text
