"""Peers' reward-hacking detectors, run live on a benchmark's series: the step each first names
the run (judged, as a live monitor is, on the steps so far) and the step its finding says the
hack began (where it says one), or None.

- rlprobe's ``REWARD_HACK_LENGTH`` (0.1): the completion length grown 1.4x from the run's first
  quarter to its last fifth while its rolling correlation with the reward stays above 0.75 for 15
  steps. rlprobe's live mode re-runs its detectors on the whole recording at each tick; so does
  this, every step.
- rlwatch's ``reward_mean_drift`` (0.5): the reward mean rising 50 steps in a row.

A peer that is not installed (``pip install -e '.[peers]'``) is left out.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable

import numpy as np

from rlmon.service.metrics import catalog as c

Series = dict[str, np.ndarray]
Named = tuple[int, int | None]  # (step named, step the finding points at)
Detector = Callable[[Series], Named | None]


def rlprobe_reward_hack_length() -> Detector | None:
    try:
        from rlprobe.doctor.detectors import RewardHackLength
        from rlprobe.doctor.runview import RunView
        from rlprobe.schemas import RunManifest, StepRecord
    except ImportError:
        return None
    manifest = RunManifest(run_id="bench", created_at=datetime.datetime.now(datetime.UTC)
                           .isoformat(), algorithm="grpo")
    detector = RewardHackLength()

    def first(s: Series) -> Named | None:
        records = [StepRecord(step=i, reward_mean=float(r), completion_len_mean=float(n),
                              kl_mean=float(k))
                   for i, (r, n, k) in enumerate(zip(s[c.REWARD], s[c.RESPONSE_LENGTH], s[c.KL],
                                                     strict=True))]
        for step in range(len(records)):
            findings = detector.check(RunView(manifest, records[:step + 1]))
            if findings:
                return step, findings[0].first_step
        return None

    return first


def rlwatch_reward_mean_drift() -> Detector | None:
    try:
        from rlwatch.config import RewardMeanDriftConfig
        from rlwatch.detectors import RewardMeanDriftDetector
    except ImportError:
        return None

    def first(s: Series) -> Named | None:
        detector = RewardMeanDriftDetector(RewardMeanDriftConfig())
        for step, reward in enumerate(s[c.REWARD]):
            alert = detector.check(step, float(reward))
            if alert is not None and alert.metric_values.get("direction") == "up":
                return step, step - int(alert.metric_values["consecutive_steps"])
        return None

    return first


def installed() -> dict[str, Detector]:
    """The peers' detectors that can be imported here, by name."""
    found = {"rlprobe REWARD_HACK_LENGTH": rlprobe_reward_hack_length(),
             "rlwatch reward_mean_drift": rlwatch_reward_mean_drift()}
    return {name: detector for name, detector in found.items() if detector is not None}
