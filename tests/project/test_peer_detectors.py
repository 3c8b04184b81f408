"""``bench/peer_detectors.py``: the peers' reward-hacking detectors, run live the way the
reward-hacking benchmark compares them with ``RewardHacking`` (the peers are real packages,
installed with the dev extras)."""

from __future__ import annotations

import numpy as np

from bench import bench_reward_hacking as bench
from bench import peer_detectors
from rlmon.service.metrics import catalog as c


def test_rlprobe_names_a_steady_climb_live_only_once_its_length_has_grown() -> None:
    first = peer_detectors.rlprobe_reward_hack_length()
    assert first is not None
    case = next(case for case in bench.cases(range(7000, 7001)) if case.kind == "climb")
    series = bench.series_of(case)
    named = first(series)
    assert named is not None
    step, pointed = named
    assert pointed is not None and case.onset <= pointed < step
    # judged live: the step it names is one whose prefix alone makes the finding, the step
    # before does not (its length-growth condition compares the last fifth with the first
    # quarter of the steps so far)
    before = first({name: values[:step] for name, values in series.items()})
    assert before is None
    length = series[c.RESPONSE_LENGTH]
    assert length[step - max(10, (step + 1) // 5) + 1:step + 1].mean() \
        >= 1.4 * length[:max(10, (step + 1) // 4)].mean()


def test_rlwatch_names_fifty_rising_steps_in_a_row_and_no_noisy_climb() -> None:
    first = peer_detectors.rlwatch_reward_mean_drift()
    assert first is not None
    steps = np.arange(200, dtype=float)
    rising = {c.REWARD: np.where(steps < 100, 0.3, 0.3 + 0.01 * (steps - 99)),
              c.RESPONSE_LENGTH: np.full(200, 300.0), c.KL: np.full(200, 0.01)}
    named = first(rising)
    assert named is not None
    step, began = named
    assert step == 149 and began == 99  # 50 steps up in a row from step 99
    noisy = dict(rising)
    noisy[c.REWARD] = rising[c.REWARD] + 0.02 * np.random.default_rng(0).standard_normal(200)
    assert first(noisy) is None


def test_installed_lists_both_peers_by_name() -> None:
    assert set(peer_detectors.installed()) == {"rlprobe REWARD_HACK_LENGTH",
                                               "rlwatch reward_mean_drift"}
