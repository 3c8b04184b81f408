"""What to change, per framework: the remedies table's text, its coverage and its docs table."""

from __future__ import annotations

import pytest

from rlmon.service.alerting.rules import default_rules
from rlmon.service.metrics import remedies
from rlmon.service.metrics.remedies import CUSTOM, FRAMEWORKS, REMEDIES

# the default pack's rules that no configuration key fixes: they keep their what-to-check line
NO_KEY = {"ReplicaMismatch", "MetricOutOfDomain", "RankMissing", "StragglerRank", "RunStalled",
          "RunDied", "StageStuck", "StepTimeRegression", "RunFailed", "RunPreempted",
          "RunFrozen"}


def test_every_alert_of_the_table_is_a_default_rule_and_every_rule_is_covered() -> None:
    names = {r.name for r in default_rules()}
    covered = [a for r in REMEDIES for a in r.alerts]
    assert len(covered) == len(set(covered))  # one remedy per alert
    assert set(covered) <= names
    assert names - set(covered) <= NO_KEY, sorted(names - set(covered) - NO_KEY)


def test_every_remedy_has_keys_for_every_framework_with_a_range_and_a_source() -> None:
    for remedy in REMEDIES:
        assert set(remedy.knobs) == set(FRAMEWORKS), remedy.alerts
        for fw, knobs in remedy.knobs.items():
            assert knobs, (remedy.alerts, fw)
            for knob in knobs:
                assert knob.typical and knob.change
                top = knob.source.split("/", 1)[0]
                assert top in {fw, "transformers"}, (fw, knob.key, knob.source)


@pytest.mark.parametrize(("framework", "keys"), [
    ("verl", ["`actor_rollout_ref.actor.kl_loss_coef` (1e-3 to 1e-2, with use_kl_loss=True)",
              "`algorithm.kl_ctrl.kl_coef`"]),
    ("openrlhf", ["raise `--algo.kl.init_coef` (1e-3 to 1e-2)"]),
    ("skyrl", ["`trainer.algorithm.kl_loss_coef`"]),
    ("trl", ["raise `beta` (1e-3 to 4e-2"]),
])
def test_the_text_names_the_detected_frameworks_keys(framework: str, keys: list[str]) -> None:
    text = remedies.remedy_text("KLDivergence", framework)
    assert text.startswith("The policy drifts from the reference")  # the plain words first
    for key in keys:
        assert key in text
    others = [k.key for fw, ks in remedies.remedy_for("KLDivergence").knobs.items()  # type: ignore[union-attr]
              if fw != framework for k in ks if k.key not in text]
    assert others  # another framework's keys are not in it


def test_a_home_grown_loop_gets_plain_words() -> None:
    for framework in ("", None, "deepspeed", "my-loop"):
        assert remedies.framework_of(framework) == CUSTOM
        text = remedies.remedy_text("EntropyCollapse", framework)
        assert "temperature 1.0" in text and "`" not in text
    assert remedies.framework_of("VERL") == "verl"
    assert remedies.remedy_text("RunStalled", "verl") == ""  # no key fixes a stall


def test_the_clip_higher_advice_reads_as_the_literature_says() -> None:
    text = remedies.remedy_text("EntropySliding", "verl")
    assert "raise `actor_rollout_ref.actor.clip_ratio_high` (to ~0.28, clip_ratio_low at 0.2)" \
        in text
    assert "set `algorithm.filter_groups.enable` (True)" in remedies.remedy_text(
        "NoLearningSignal", "verl")


def test_the_docs_table_lists_every_key_and_its_source() -> None:
    table = remedies.table_markdown()
    for remedy in REMEDIES:
        for knobs in remedy.knobs.values():
            for knob in knobs:
                assert f"`{knob.key}`" in table
                assert f"`{knob.source}`" in table
    assert table.count("\n| `") == len(REMEDIES)
