"""The scaling signatures the sanity layer can see in a logged run, given its settings.

A run resumed with another gradient-accumulation or context-parallel size shows a loss divided
or summed by that size as a jump by the sizes' ratio at the resume; tokens counted once per
rank sharing a sample show as more tokens per step than the batch can hold. Both need the
settings the files recorded (:mod:`.run_settings`); without them nothing is claimed.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

from rlmon.service.alerting import sanity
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.diagnose.logged_run import LoggedRun
from rlmon.service.metrics import catalog as c
from rlmon.service.metrics import keymaps

__all__ = ["CUMULATIVE_TOKENS", "PER_STEP_TOKENS", "scaling_signatures"]

_SHIFTED = (c.LOSS, keymaps.relay_name("trl", "loss"), c.GRAD_NORM)
_SETTINGS = ("gradient_accumulation_steps", "context_parallel")
# Token counters as logged: running totals (TRL's GRPO, the Hugging Face Trainer) and per-step
# counts (verl's throughput metrics), by their bare key.
CUMULATIVE_TOKENS = ("num_tokens", "num_input_tokens_seen")
PER_STEP_TOKENS = ("perf/total_num_tokens",)


def _level_shifts(run: LoggedRun, records: Sequence[StepRecord]) -> list[sanity.Finding]:
    out = []
    segments = run.segments
    for previous, segment in pairwise(segments):
        end = next((s.first_step for s in segments if s.first_step > segment.first_step), None)
        for setting in _SETTINGS:
            old = getattr(previous.settings, setting)
            new = getattr(segment.settings, setting)
            if old is None or new is None or old == new:
                continue
            for metric in _SHIFTED:
                before = [r.metrics[metric] for r in records
                          if r.step < segment.first_step and metric in r.metrics]
                after = [r.metrics[metric] for r in records if r.step >= segment.first_step
                         and (end is None or r.step < end) and metric in r.metrics]
                level = sanity.level_shift(before, after, new / old)
                if level is not None:
                    out.append(sanity.scaled_by_setting(
                        metric, setting, old, new, segment.first_step, level))
    return out


def _tokens_per_step(run: LoggedRun) -> tuple[str, list[tuple[int, float]]] | None:
    """The run's token counter as tokens per optimizer step (a running total differenced over
    the steps between two logs)."""
    keys = {key.removeprefix("train/"): key for key in run.keys}
    for bare in PER_STEP_TOKENS:
        if bare in keys:
            key = keys[bare]
            return key, [(s, v[key]) for s, v in run.rows.items() if key in v]
    for bare in CUMULATIVE_TOKENS:
        if bare in keys:
            key = keys[bare]
            totals = [(s, v[key]) for s, v in run.rows.items() if key in v]
            return key, [(s, (t - pt) / (s - ps))
                         for (ps, pt), (s, t) in pairwise(totals) if s > ps]
    return None


def scaling_signatures(run: LoggedRun, records: Sequence[StepRecord]) -> list[sanity.Finding]:
    """The level shifts at resumes that changed GA or CP, and an over-counted token count."""
    out = _level_shifts(run, records)
    tokens = _tokens_per_step(run)
    for segment_index, segment in enumerate(run.segments):
        capacity = segment.settings.tokens_per_step_at_most()
        if tokens is None or capacity is None:
            continue
        most, how = capacity
        nxt = run.segments[segment_index + 1].first_step \
            if segment_index + 1 < len(run.segments) else None
        key, per_step = tokens
        mine = [(s, v) for s, v in per_step
                if s >= segment.first_step and (nxt is None or s < nxt)]
        found = sanity.tokens_overcounted(key, mine, most, segment.settings.context_parallel,
                                          how)
        if found is not None:
            out.append(found)
    return out
