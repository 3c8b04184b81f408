"""The one list of canonical metrics (DESIGN.md, "Canonical metrics").

Every other place that needs a metric name, form, unit, domain, threshold or panel reads it from
here: the partial merge, the exporter, the rule pack, the dashboards and the README table.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from types import MappingProxyType

from rlmon.service.spec import (
    AlertSpec,
    Comparison,
    Domain,
    Form,
    MetricSpec,
    PanelHint,
    Severity,
    Unit,
)

__all__ = ["CATALOG", "STRAGGLER_METRIC", "STRAGGLER_SOURCE", "get", "lookup", "metrics"]

MEAN = (Form.MEAN,)
SUM = (Form.SUM,)
MIN = (Form.MIN,)
MAX = (Form.MAX,)
VALUE = (Form.VALUE,)
NORM = (Form.VALUE, Form.SQSUM)
MOMENTS = (Form.MOMENTS,)
CRIT = Severity.CRITICAL
WARN = Severity.WARNING


def _panel(dashboard: str, row: str, order: int, title: str = "") -> PanelHint:
    return PanelHint(dashboard=dashboard, row=row, order=order, title=title)


_SPECS: tuple[MetricSpec, ...] = (
    # --- policy optimisation -------------------------------------------------------------------
    MetricSpec(
        "actor/loss", "Policy objective, token-weighted over the step.", MEAN,
        what_to_check="Compare with the same loss-reduction mode only; a jump with flat reward "
        "often means a bad batch or a learning-rate spike.",
        panel=_panel("overview", "Optimisation", 10),
    ),
    MetricSpec(
        "actor/clip_ratio", "Fraction of loss tokens whose PPO ratio was clipped.", MEAN,
        Unit.RATIO, Domain.FRACTION, healthy=(0.0, 0.2),
        what_to_check="Policy moves too far per update: lower the learning rate or the number of "
        "PPO epochs / mini-batches per rollout.",
        alerts=(AlertSpec("ClipRatioHigh", WARN, Comparison.GT, 0.3, for_steps=3,
                          summary="PPO clip ratio above 0.3"),),
        panel=_panel("overview", "Optimisation", 20),
    ),
    MetricSpec(
        "actor/entropy", "Token-mean policy entropy over loss tokens.", MEAN,
        Unit.NATS, Domain.NONNEGATIVE, healthy=(0.1, 5.0),
        what_to_check="The policy became deterministic: check the KL coefficient, the reward for "
        "hacking, and the sampling temperature.",
        alerts=(AlertSpec("EntropyCollapse", CRIT, Comparison.LT, 0.01, for_steps=3,
                          summary="Policy entropy collapsed below 0.01"),),
        panel=_panel("overview", "Optimisation", 30),
    ),
    MetricSpec(
        "actor/kl", "Token-mean KL divergence to the reference policy.", MEAN,
        Unit.NATS, healthy=(0.0, 1.0),
        what_to_check="The policy drifts from the reference: raise the KL coefficient or check "
        "for reward hacking.",
        alerts=(AlertSpec("KLDivergence", WARN, Comparison.GT, 2.0, for_steps=3,
                          summary="KL to the reference above 2.0"),),
        panel=_panel("overview", "Optimisation", 40),
    ),
    MetricSpec(
        "actor/approx_kl",
        "Token-mean KL between the policy before and after the update (ppo_kl).", MEAN,
        Unit.NATS, healthy=(0.0, 0.05),
        what_to_check="Large updates per step: lower the learning rate.",
        panel=_panel("overview", "Optimisation", 45),
    ),
    MetricSpec(
        "actor/grad_norm", "Global gradient norm before clipping.", NORM,
        Unit.NONE, Domain.NONNEGATIVE, healthy=(0.1, 10.0),
        what_to_check="Exploding gradients: check for NaN inputs, the learning rate and the "
        "loss scale; under DeepSpeed 0.13.5-0.14.0 a NaN norm is a known bug.",
        alerts=(AlertSpec("GradNormHigh", WARN, Comparison.GT, 10.0, for_steps=3,
                          summary="Gradient norm above 10"),),
        panel=_panel("overview", "Optimisation", 50),
    ),
    MetricSpec("actor/lr", "Learning rate.", VALUE, Unit.NONE, Domain.NONNEGATIVE,
               panel=_panel("overview", "Optimisation", 60)),
    MetricSpec("actor/loss_scale", "DeepSpeed fp16 dynamic loss scale.", VALUE,
               Unit.NONE, Domain.NONNEGATIVE,
               what_to_check="A collapsing loss scale means repeated fp16 overflows.",
               panel=_panel("overview", "Optimisation", 70)),
    MetricSpec("actor/skipped_steps", "Optimizer steps skipped by DeepSpeed (overflow).", VALUE,
               Unit.STEPS, Domain.NONNEGATIVE, panel=_panel("overview", "Optimisation", 80)),
    MetricSpec("actor/ppo_ratio", "Token-mean PPO ratio pi_theta / pi_old.", MEAN,
               Unit.NONE, Domain.NONNEGATIVE, healthy=(0.8, 1.2),
               panel=_panel("overview", "Optimisation", 85)),
    MetricSpec("actor/advantage", "Token-mean advantage over loss tokens.", MEAN,
               panel=_panel("overview", "Optimisation", 90)),
    MetricSpec("actor/advantage_std", "Standard deviation of advantages over loss tokens.",
               MOMENTS, Unit.NONE, Domain.NONNEGATIVE,
               panel=_panel("overview", "Optimisation", 95)),
    # --- rollout <-> trainer mismatch -----------------------------------------------------------
    MetricSpec(
        "actor/is_ratio",
        "Token-mean importance ratio exp(logp_trainer_old - logp_rollout).", MEAN,
        Unit.NONE, Domain.NONNEGATIVE, healthy=(0.8, 1.25),
        what_to_check="Rollout and trainer policies disagree: check weight sync to the rollout "
        "engine, its dtype and sampling parameters, and the IS correction.",
        alerts=(AlertSpec("ISRatioDivergence", CRIT, Comparison.OUTSIDE, 0.5, 2.0,
                          summary="Token-mean IS ratio outside [0.5, 2.0]"),),
        panel=_panel("overview", "Rollout / trainer mismatch", 10),
    ),
    MetricSpec(
        "actor/is_ratio_min", "Smallest token importance ratio in the step.", MIN,
        Unit.NONE, Domain.NONNEGATIVE,
        what_to_check="Some tokens come from a stale policy: check the policy lag and weight sync.",
        alerts=(AlertSpec("ISRatioStale", WARN, Comparison.LT, 0.1,
                          summary="Smallest IS ratio below 0.1"),),
        panel=_panel("overview", "Rollout / trainer mismatch", 20),
    ),
    MetricSpec("actor/is_ratio_max", "Largest token importance ratio in the step.", MAX,
               Unit.NONE, Domain.NONNEGATIVE,
               panel=_panel("overview", "Rollout / trainer mismatch", 30)),
    MetricSpec(
        "actor/logp_diff", "Token-mean abs(logp_trainer_old - logp_rollout).", MEAN,
        Unit.NATS, Domain.NONNEGATIVE, healthy=(0.0, 0.05),
        what_to_check="Trainer and rollout log-probabilities disagree: dtype, kernels, or "
        "weights out of sync.",
        alerts=(
            AlertSpec("LogprobMismatch", WARN, Comparison.GT, 0.1,
                      summary="Token-mean logprob difference above 0.1"),
            AlertSpec("LogprobDivergence", CRIT, Comparison.GT, 1.0,
                      summary="Token-mean logprob difference above 1.0"),
        ),
        panel=_panel("overview", "Rollout / trainer mismatch", 40),
    ),
    MetricSpec("actor/logp_diff_max", "Worst token abs(logp_trainer_old - logp_rollout).", MAX,
               Unit.NATS, Domain.NONNEGATIVE,
               panel=_panel("overview", "Rollout / trainer mismatch", 50)),
    MetricSpec("actor/is_masked_frac",
               "Fraction of tokens masked or truncated by the IS correction.", MEAN,
               Unit.RATIO, Domain.FRACTION, healthy=(0.0, 0.05),
               panel=_panel("overview", "Rollout / trainer mismatch", 60)),
    # --- critic -------------------------------------------------------------------------------
    MetricSpec("critic/loss", "Critic (value) loss, token-weighted.", MEAN,
               panel=_panel("overview", "Critic", 10)),
    MetricSpec("critic/value", "Token-mean value estimate.", MEAN,
               panel=_panel("overview", "Critic", 20)),
    MetricSpec("critic/clip_ratio", "Fraction of value estimates clipped.", MEAN,
               Unit.RATIO, Domain.FRACTION, panel=_panel("overview", "Critic", 30)),
    MetricSpec("critic/grad_norm", "Critic gradient norm before clipping.", NORM,
               Unit.NONE, Domain.NONNEGATIVE, panel=_panel("overview", "Critic", 40)),
    MetricSpec("critic/returns", "Token-mean return.", MEAN,
               panel=_panel("overview", "Critic", 50)),
    MetricSpec("critic/lr", "Critic learning rate.", VALUE, Unit.NONE, Domain.NONNEGATIVE,
               panel=_panel("overview", "Critic", 60)),
    # --- rollout ------------------------------------------------------------------------------
    MetricSpec(
        "rollout/reward", "Mean reward per response.", MEAN,
        what_to_check="Reward is flat at zero: check the reward function and the answer parser.",
        alerts=(AlertSpec("RewardStuck", WARN, Comparison.ABS_LT, 1e-9, for_steps=20,
                          summary="Mean reward stuck at zero"),),
        panel=_panel("overview", "Reward", 10),
    ),
    MetricSpec("rollout/reward_std", "Standard deviation of rewards over responses.", MOMENTS,
               Unit.NONE, Domain.NONNEGATIVE, panel=_panel("overview", "Reward", 20)),
    MetricSpec("rollout/reward_min", "Smallest reward in the step.", MIN,
               panel=_panel("overview", "Reward", 30)),
    MetricSpec("rollout/reward_max", "Largest reward in the step.", MAX,
               panel=_panel("overview", "Reward", 40)),
    MetricSpec(
        "rollout/frac_reward_zero_std", "Fraction of prompt groups whose rewards all tie.", MEAN,
        Unit.RATIO, Domain.FRACTION, healthy=(0.0, 0.5),
        what_to_check="No group has a reward spread, so GRPO advantages are zero: the task is too "
        "easy or too hard, or the reward is broken.",
        alerts=(AlertSpec("NoLearningSignal", CRIT, Comparison.GE, 0.99, for_steps=3,
                          summary="Almost every prompt group has tied rewards"),),
        panel=_panel("overview", "Reward", 50),
    ),
    MetricSpec("rollout/response_length", "Mean response length.", MEAN,
               Unit.TOKENS, Domain.NONNEGATIVE, panel=_panel("overview", "Rollout", 10)),
    MetricSpec("rollout/response_length_max", "Longest response in the step.", MAX,
               Unit.TOKENS, Domain.NONNEGATIVE, panel=_panel("overview", "Rollout", 20)),
    MetricSpec("rollout/prompt_length", "Mean prompt length.", MEAN,
               Unit.TOKENS, Domain.NONNEGATIVE, panel=_panel("overview", "Rollout", 25)),
    MetricSpec(
        "rollout/clipped_ratio", "Fraction of responses that hit the length limit.", MEAN,
        Unit.RATIO, Domain.FRACTION, healthy=(0.0, 0.2),
        what_to_check="Responses run into max length: raise the limit or penalise length.",
        alerts=(AlertSpec("CompletionsTruncated", WARN, Comparison.GT, 0.8, for_steps=3,
                          summary="Most completions truncated at the length limit"),),
        panel=_panel("overview", "Rollout", 30),
    ),
    MetricSpec("rollout/policy_lag",
               "Trainer step minus the weights version used to generate.", MAX,
               Unit.STEPS, Domain.NONNEGATIVE, panel=_panel("overview", "Rollout", 40)),
    MetricSpec("rollout/tokens", "Tokens generated in the step.", SUM,
               Unit.TOKENS, Domain.NONNEGATIVE, panel=_panel("rollout", "Throughput", 10)),
    MetricSpec("rollout/samples", "Responses generated in the step.", SUM,
               Unit.NONE, Domain.NONNEGATIVE, panel=_panel("rollout", "Throughput", 20)),
    MetricSpec("rollout/tokens_per_second",
               "Generation throughput summed over rollout engines.", SUM,
               Unit.TOKENS_PER_SECOND, Domain.NONNEGATIVE,
               panel=_panel("rollout", "Throughput", 30)),
    MetricSpec("rollout/num_running_reqs",
               "Requests running: each engine's mean over its scheduler iterations in the step, "
               "summed over engines.", SUM,
               Unit.REQUESTS, Domain.NONNEGATIVE, panel=_panel("rollout", "Engine", 10)),
    MetricSpec("rollout/num_running_reqs_max",
               "Most requests running on one engine in any scheduler iteration of the step.", MAX,
               Unit.REQUESTS, Domain.NONNEGATIVE, panel=_panel("rollout", "Engine", 15)),
    MetricSpec("rollout/num_waiting_reqs",
               "Requests waiting: each engine's mean over its scheduler iterations in the step, "
               "summed over engines.", SUM,
               Unit.REQUESTS, Domain.NONNEGATIVE, panel=_panel("rollout", "Engine", 20)),
    MetricSpec("rollout/num_waiting_reqs_max",
               "Most requests waiting on one engine in any scheduler iteration of the step.", MAX,
               Unit.REQUESTS, Domain.NONNEGATIVE, panel=_panel("rollout", "Engine", 25)),
    MetricSpec("rollout/kv_cache_usage",
               "KV-cache usage, mean over every engine's scheduler iterations in the step.", MEAN,
               Unit.RATIO, Domain.FRACTION, panel=_panel("rollout", "Engine", 30)),
    MetricSpec("rollout/kv_cache_usage_max",
               "Highest KV-cache usage of any engine in any scheduler iteration of the step.", MAX,
               Unit.RATIO, Domain.FRACTION, panel=_panel("rollout", "Engine", 35)),
    MetricSpec("rollout/preemptions", "Requests preempted, summed over engines.", SUM,
               Unit.REQUESTS, Domain.NONNEGATIVE, panel=_panel("rollout", "Engine", 40)),
    MetricSpec("rollout/prefix_cache_hit_rate",
               "Prefix-cache hits over queries, pooled over engines.", MEAN,
               Unit.RATIO, Domain.FRACTION, panel=_panel("rollout", "Engine", 50)),
    # --- performance --------------------------------------------------------------------------
    MetricSpec("perf/step_seconds", "Wall time of the step (the slowest rank).", MAX,
               Unit.SECONDS, Domain.NONNEGATIVE, per_rank_spread=True,
               panel=_panel("overview", "Performance", 10)),
    MetricSpec("perf/straggler_ratio",
               "Slowest rank's step time over the median rank's (derived by the aggregator).",
               VALUE, Unit.NONE, Domain.NONNEGATIVE,
               panel=_panel("overview", "Performance", 20)),
    MetricSpec("timing/generate_seconds", "Time spent generating rollouts.", MAX,
               Unit.SECONDS, Domain.NONNEGATIVE, panel=_panel("overview", "Performance", 30)),
    MetricSpec("timing/reference_seconds", "Time spent on reference log-probabilities.", MAX,
               Unit.SECONDS, Domain.NONNEGATIVE, panel=_panel("overview", "Performance", 40)),
    MetricSpec("timing/reward_seconds", "Time spent computing rewards.", MAX,
               Unit.SECONDS, Domain.NONNEGATIVE, panel=_panel("overview", "Performance", 50)),
    MetricSpec("timing/train_seconds", "Time spent in the policy update.", MAX,
               Unit.SECONDS, Domain.NONNEGATIVE, panel=_panel("overview", "Performance", 60)),
    MetricSpec("timing/weight_sync_seconds", "Time spent syncing weights to rollout engines.",
               MAX, Unit.SECONDS, Domain.NONNEGATIVE,
               panel=_panel("overview", "Performance", 70)),
    MetricSpec("perf/memory_allocated_bytes", "Peak device memory allocated (worst rank).", MAX,
               Unit.BYTES, Domain.NONNEGATIVE, panel=_panel("overview", "Performance", 80)),
    MetricSpec("perf/memory_reserved_bytes", "Peak device memory reserved (worst rank).", MAX,
               Unit.BYTES, Domain.NONNEGATIVE, panel=_panel("overview", "Performance", 90)),
)

CATALOG: Mapping[str, MetricSpec] = MappingProxyType({spec.name: spec for spec in _SPECS})

STRAGGLER_SOURCE = "perf/step_seconds"
STRAGGLER_METRIC = "perf/straggler_ratio"


def metrics() -> Iterator[MetricSpec]:
    """Iterate over the catalog in declaration order."""
    return iter(_SPECS)


def lookup(name: str) -> MetricSpec | None:
    """The spec of a canonical metric, or None for a user-defined one."""
    return CATALOG.get(name)


def get(name: str) -> MetricSpec:
    """The spec of a canonical metric; KeyError names the metric when it is not in the catalog."""
    try:
        return CATALOG[name]
    except KeyError:
        raise KeyError(f"metric {name!r} is not in the rlmon catalog") from None
