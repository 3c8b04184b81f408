"""Sanity layer (seed 000's checklist) and the DeepSpeed loss normalization metadata."""

from __future__ import annotations

import math

from rlmon.service.alerting.sanity import (
    Kind,
    LossNormalization,
    SanityChecker,
    deepspeed_nan_bug,
    relay_warnings,
)
from rlmon.service.metrics import catalog, keymaps

TRL_LOSS = keymaps.relay_name("trl", "loss")


def _feed(checker: SanityChecker, series: list[dict[str, float]]) -> list:
    found = []
    for step, values in enumerate(series):
        found += checker.observe(step, values)
    return found


def test_dpo_loss_stuck_at_ln2_fires_once_after_five_steps() -> None:
    checker = SanityChecker(dpo=True)
    series = [{TRL_LOSS: 0.6931 + 1e-4 * (i % 2)} for i in range(8)]
    found = _feed(checker, series)
    assert [f.kind for f in found] == [Kind.DPO_LOSS_LN2]
    assert found[0].step == 4 and found[0].metric == TRL_LOSS


def test_ln2_is_not_stuck_for_sft_and_a_moving_loss_never_fires() -> None:
    assert _feed(SanityChecker(dpo=False), [{TRL_LOSS: math.log(2)}] * 8) == []
    moving = [{TRL_LOSS: 0.6931 - 0.01 * i} for i in range(8)]
    assert _feed(SanityChecker(dpo=True), moving) == []


def test_loss_stuck_at_ln3() -> None:
    found = _feed(SanityChecker(), [{catalog.LOSS: 1.0986}] * 5)
    assert [f.kind for f in found] == [Kind.LOSS_LN3]


def test_nan_grad_norm_is_a_known_bug_only_on_affected_deepspeed() -> None:
    assert deepspeed_nan_bug("0.13.5") and deepspeed_nan_bug("0.14.0")
    assert not deepspeed_nan_bug("0.13.4") and not deepspeed_nan_bug("0.14.1")
    assert not deepspeed_nan_bug("0.12.3") and not deepspeed_nan_bug(None)
    hit = SanityChecker(deepspeed_version="0.14.0").observe(2, {catalog.GRAD_NORM: math.nan})
    assert [f.kind for f in hit] == [Kind.GRAD_NORM_NAN_KNOWN_BUG] and hit[0].known_bug
    assert SanityChecker(deepspeed_version="0.12.3").observe(2, {catalog.GRAD_NORM: math.nan}) == []


def test_collapsing_loss_scale() -> None:
    checker = SanityChecker()
    scales = [65536.0, 65536.0, 32768.0, 4096.0, 512.0, 256.0]
    found = _feed(checker, [{catalog.LOSS_SCALE: s} for s in scales])
    assert [f.step for f in found] == [5]  # 65536 / 256 = 2^8
    assert _feed(SanityChecker(), [{catalog.LOSS_SCALE: 2.0**16 / 2**i} for i in range(4)]) == []


def test_loss_scale_collapse_fires_once_and_rearms_only_after_recovery() -> None:
    """A collapsed scale that stays low is one finding, not one per step; once the scale has
    held steady for a whole window (recovered), a fresh collapse fires again."""
    checker = SanityChecker(scale_window=4)
    collapse = [65536.0, 128.0, 128.0, 128.0]  # fires at step 1, stays collapsed to step 3
    steady = [128.0] * 4  # the window forgets the peak: recovered, re-armed
    again = [128.0 * 2**8, 128.0, 64.0]  # overflows again: one new finding
    found = _feed(checker, [{catalog.LOSS_SCALE: s} for s in collapse + steady + again])
    assert [f.step for f in found] == [1, 9]
    assert all(f.kind is Kind.LOSS_SCALE_COLLAPSE for f in found)


def test_known_nan_grad_norm_fires_once_per_nan_stretch() -> None:
    checker = SanityChecker(deepspeed_version="0.14.0")
    series = [math.nan, math.nan, 1.0, math.nan, math.nan]
    found = _feed(checker, [{catalog.GRAD_NORM: v} for v in series])
    assert [f.step for f in found] == [0, 3]


def test_relayed_keys_that_are_not_comparable_warn() -> None:
    found = relay_warnings("openrlhf", ["policy_loss", "ppo_clip_ratio", "unknown_key"])
    assert [f.metric for f in found] == ["openrlhf/policy_loss"]
    assert "uneven token counts" in found[0].message


def test_loss_normalization_metadata() -> None:
    ds = LossNormalization(deepspeed=True, gradient_accumulation_steps=4, scaled_by_gas=True,
                           deepspeed_version="0.14.0")
    assert ds.comparable(0.5) == 2.0  # seed 000: DeepSpeed 0.5 at gas 4 is a plain 2.0
    meta = ds.as_metadata()
    assert meta["comparable_loss_factor"] == 4.0 and meta["deepspeed_nan_grad_norm_bug"]
    assert LossNormalization(deepspeed=False, gradient_accumulation_steps=4).comparable(2.0) == 2.0


def test_a_level_shift_matches_a_settings_ratio_only_out_of_the_noise() -> None:
    from rlmon.service.alerting.sanity import level_shift

    before = [2.00, 1.99, 2.01, 1.98, 2.00]
    assert level_shift(before, [v / 4 for v in before], 4.0) == 0.25  # or its inverse
    assert level_shift(before, [v * 4 for v in before], 4.0) == 4.0
    assert level_shift(before, before, 4.0) is None  # the setting changed, the loss did not
    assert level_shift(before, [v / 3 for v in before], 4.0) is None  # not the setting's ratio
    noisy = [2.0, 0.5, 2.1, 0.4, 1.9]  # swings wider than the shift could be told from
    assert level_shift(noisy, [v / 4 for v in noisy], 4.0) is None


def test_checker_args_read_the_run_info_the_service_keeps() -> None:
    from rlmon.service.alerting.sanity import checker_args
    from rlmon.service.contract.run_info import RunInfo

    assert checker_args(None) == (False, None)
    assert checker_args(RunInfo(algorithm="DPO", deepspeed_version="0.14.0")) == (True, "0.14.0")
    assert checker_args(RunInfo(dpo=True)) == (True, None)
