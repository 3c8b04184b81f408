"""Key maps: every row names a real catalog metric, and `rlmon catalog --framework` prints them."""

from __future__ import annotations

import json

import pytest

from rlmon.cli import main
from rlmon.service import catalog, keymaps
from rlmon.service.generated import all_artifacts


@pytest.mark.parametrize("framework", keymaps.FRAMEWORKS)
def test_rows_are_consistent(framework: str) -> None:
    rows = list(keymaps.mappings(framework))
    assert rows, framework
    for row in rows:
        if row.canonical is not None:
            assert catalog.lookup(row.canonical) is not None
        if not row.comparable:
            assert row.note, f"{row.key}: a non-comparable key must say why"
            assert keymaps.canonical(framework, row.key) is None


def test_lossy_reductions_are_not_published_under_canonical_names() -> None:
    assert keymaps.canonical("openrlhf", "policy_loss") is None
    assert keymaps.canonical("openrlhf", "ppo_clip_ratio") == "actor/clip_ratio"
    assert keymaps.canonical("trl", "sampling/importance_sampling_ratio/mean") is None
    assert keymaps.canonical("verl", "actor/pg_clipfrac") is None
    assert keymaps.relay_name("verl", "actor/pg_loss") == "verl/actor/pg_loss"
    with pytest.raises(KeyError, match="unknown framework"):
        list(keymaps.mappings("megatron"))


@pytest.mark.parametrize("framework", ["openrlhf", "skyrl", "verl", "trl"])
def test_cli_prints_json(framework: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["catalog", "--framework", framework, "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["framework"] for r in rows} == {framework}
    assert all(r["rlmon"] in ("exact", "recomputed", "relayed") for r in rows)
    assert len(rows) == len(list(keymaps.mappings(framework)))


def test_cli_table_and_markdown(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["catalog", "--framework", "skyrl", "--format", "markdown"]) == 0
    out = capsys.readouterr().out
    assert "`policy/policy_loss`" in out and "sum over micro-batches and DP" in out
    assert main(["catalog", "--framework", "openrlhf"]) == 0
    assert "ppo_clip_ratio" in capsys.readouterr().out


def test_matrix_marks_best_fidelity() -> None:
    matrix = keymaps.fidelity_matrix()
    assert matrix["actor/is_ratio"]["openrlhf"] is keymaps.Fidelity.EXACT  # driver hook
    assert matrix["actor/loss"]["skyrl"] is keymaps.Fidelity.RECOMPUTED
    assert matrix["actor/loss"]["verl"] is keymaps.Fidelity.RELAYED
    assert matrix["rollout/prefix_cache_hit_rate"]["vllm"] is keymaps.Fidelity.RECOMPUTED
    table = keymaps.matrix_markdown()
    assert table.count("\n") == 2 + len(matrix)


def test_readme_framework_table_is_fresh() -> None:
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    mine = [a for a in all_artifacts() if a.block == "frameworks"]
    assert len(mine) == 1
    current = (root / mine[0].path).read_text(encoding="utf-8")
    assert mine[0].expected(current) == current, "run `rlmon generate`"
