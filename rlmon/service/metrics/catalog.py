"""The one list of canonical metrics (docs/design.md, "Canonical metrics").

Every other place that needs a metric name, form, unit, domain, threshold or panel reads it from
here: the partial merge, the exporter, the rule pack, the dashboards and the table of docs/metrics.md.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from types import MappingProxyType

from rlmon.service.metrics.spec import (
    AlertSpec,
    BaselineParams,
    BaselineSpec,
    Comparison,
    Domain,
    Form,
    LivenessAlertSpec,
    MetricSpec,
    PanelHint,
    Severity,
    Unit,
)

__all__ = [
    "CATALOG",
    "EARLY_WARNINGS",
    "LIVENESS_ALERTS",
    "NO_CRITICAL",
    "STRAGGLER_ALERT",
    "STRAGGLER_METRIC",
    "STRAGGLER_SOURCE",
    "form_error",
    "get",
    "lookup",
    "metrics",
    "sample_metrics",
    "samples_for",
]

MEAN = (Form.MEAN,)
SUM = (Form.SUM,)
MIN = (Form.MIN,)
MAX = (Form.MAX,)
VALUE = (Form.VALUE,)
NORM = (Form.VALUE, Form.SQSUM)
MOMENTS = (Form.MOMENTS,)
TOP = (Form.TOP,)
BOTTOM = (Form.BOTTOM,)
CRIT = Severity.CRITICAL
WARN = Severity.WARNING
# Hysteresis of the fixed rules: good steps in a row before a firing alert resolves (Prometheus'
# keep_firing_for). Measured on healthy-but-noisy runs (bench/bench_hard_negatives.py's kinds,
# seeds 9000-9002, not the bench's own): a metric sitting near its threshold leaves it for up to
# 30 steps between crossings (95th percentile); 20 cut its flaps from 83 to 4 there (figures in
# docs/alerting.md, "Hysteresis").
RESOLVE_AFTER = 20


# The canonical names, each typed here once: the declarations below and every other module
# of rlmon refer to these constants (tests/project/test_catalog_names.py fails on a name literal
# elsewhere). A name's constant is the part after the section, upper-cased; critic/ names
# carry CRITIC_.
LOSS = "actor/loss"
CLIP_RATIO = "actor/clip_ratio"
ENTROPY = "actor/entropy"
KL = "actor/kl"
APPROX_KL = "actor/approx_kl"
GRAD_NORM = "actor/grad_norm"
LR = "actor/lr"
LOSS_SCALE = "actor/loss_scale"
SKIPPED_STEPS = "actor/skipped_steps"
PPO_RATIO = "actor/ppo_ratio"
ADVANTAGE = "actor/advantage"
ADVANTAGE_STD = "actor/advantage_std"
IS_RATIO = "actor/is_ratio"
IS_RATIO_MIN = "actor/is_ratio_min"
IS_RATIO_MAX = "actor/is_ratio_max"
LOGP_DIFF = "actor/logp_diff"
LOGP_DIFF_MAX = "actor/logp_diff_max"
IS_MASKED_FRAC = "actor/is_masked_frac"
# Sample metrics (ranked forms): the worst sequences of the step, each with an id and an optional
# payload; the value is the worst one's score.
LOGP_DIFF_WORST = "actor/logp_diff_worst"
IS_RATIO_LOWEST = "actor/is_ratio_lowest"

CRITIC_LOSS = "critic/loss"
CRITIC_VALUE = "critic/value"
CRITIC_CLIP_RATIO = "critic/clip_ratio"
CRITIC_GRAD_NORM = "critic/grad_norm"
CRITIC_RETURNS = "critic/returns"
CRITIC_LR = "critic/lr"

REWARD = "rollout/reward"
REWARD_STD = "rollout/reward_std"
REWARD_MIN = "rollout/reward_min"
REWARD_MAX = "rollout/reward_max"
FRAC_REWARD_ZERO_STD = "rollout/frac_reward_zero_std"
RESPONSE_LENGTH = "rollout/response_length"
RESPONSE_LENGTH_MAX = "rollout/response_length_max"
PROMPT_LENGTH = "rollout/prompt_length"
CLIPPED_RATIO = "rollout/clipped_ratio"
POLICY_LAG = "rollout/policy_lag"
TOKENS = "rollout/tokens"
SAMPLES = "rollout/samples"
TOKENS_PER_SECOND = "rollout/tokens_per_second"
NUM_RUNNING_REQS = "rollout/num_running_reqs"
NUM_RUNNING_REQS_MAX = "rollout/num_running_reqs_max"
NUM_WAITING_REQS = "rollout/num_waiting_reqs"
NUM_WAITING_REQS_MAX = "rollout/num_waiting_reqs_max"
KV_CACHE_USAGE = "rollout/kv_cache_usage"
KV_CACHE_USAGE_MAX = "rollout/kv_cache_usage_max"
PREEMPTIONS = "rollout/preemptions"
PREFIX_CACHE_HIT_RATE = "rollout/prefix_cache_hit_rate"
REWARD_HIGHEST = "rollout/reward_highest"
REWARD_LOWEST = "rollout/reward_lowest"
TRUNCATED_LONGEST = "rollout/truncated_longest"
VERIFIER_SCORE = "rollout/verifier_score"

STEP_SECONDS = "perf/step_seconds"
STRAGGLER_RATIO = "perf/straggler_ratio"
GENERATE_SECONDS = "timing/generate_seconds"
REFERENCE_SECONDS = "timing/reference_seconds"
REWARD_SECONDS = "timing/reward_seconds"
TRAIN_SECONDS = "timing/train_seconds"
WEIGHT_SYNC_SECONDS = "timing/weight_sync_seconds"
MEMORY_ALLOCATED_BYTES = "perf/memory_allocated_bytes"
MEMORY_RESERVED_BYTES = "perf/memory_reserved_bytes"
GPU_UTILIZATION = "perf/gpu_utilization"
GPU_POWER_WATTS = "perf/gpu_power_watts"
HOST_RSS_BYTES = "perf/host_rss_bytes"
HOST_CPU_CORES = "perf/host_cpu_cores"


def _panel(dashboard: str, row: str, order: int, title: str = "") -> PanelHint:
    return PanelHint(dashboard=dashboard, row=row, order=order, title=title)


_SPECS: tuple[MetricSpec, ...] = (
    # --- policy optimisation -------------------------------------------------------------------
    MetricSpec(
        LOSS, "Policy objective, token-weighted over the step.", MEAN,
        what_to_check="Compare with the same loss-reduction mode only; a jump with flat reward "
        "often means a bad batch or a learning-rate spike.",
        panel=_panel("overview", "Optimisation", 10),
    ),
    MetricSpec(
        CLIP_RATIO, "Fraction of loss tokens whose PPO ratio was clipped.", MEAN,
        Unit.RATIO, Domain.FRACTION, healthy=(0.0, 0.2),
        what_to_check="Policy moves too far per update: lower the learning rate or the number of "
        "PPO epochs / mini-batches per rollout.",
        alerts=(AlertSpec("ClipRatioHigh", WARN, Comparison.GT, 0.3, for_steps=3,
                          summary="PPO clip ratio above 0.3", resolve_after=RESOLVE_AFTER,
                          critical=0.5),),
        panel=_panel("overview", "Optimisation", 20),
    ),
    MetricSpec(
        ENTROPY, "Token-mean policy entropy over loss tokens.", MEAN,
        Unit.NATS, Domain.NONNEGATIVE, healthy=(0.1, 5.0),
        what_to_check="The policy became deterministic: check the KL coefficient, the reward for "
        "hacking, and the sampling temperature.",
        alerts=(AlertSpec("EntropyCollapse", CRIT, Comparison.LT, 0.01, for_steps=3,
                          summary="Policy entropy collapsed below 0.01",
                          resolve_after=RESOLVE_AFTER),),
        panel=_panel("overview", "Optimisation", 30),
    ),
    MetricSpec(
        KL, "Token-mean KL divergence to the reference policy.", MEAN,
        Unit.NATS, healthy=(0.0, 1.0),
        what_to_check="The policy drifts from the reference: raise the KL coefficient or check "
        "for reward hacking.",
        alerts=(AlertSpec("KLDivergence", WARN, Comparison.GT, 2.0, for_steps=3,
                          summary="KL to the reference above 2.0", resolve_after=RESOLVE_AFTER,
                          critical=10.0),),
        panel=_panel("overview", "Optimisation", 40),
    ),
    MetricSpec(
        APPROX_KL,
        "Token-mean KL between the policy before and after the update (ppo_kl).", MEAN,
        Unit.NATS, healthy=(0.0, 0.05),
        what_to_check="Large updates per step: lower the learning rate.",
        panel=_panel("overview", "Optimisation", 45),
    ),
    MetricSpec(
        GRAD_NORM, "Global gradient norm before clipping.", NORM,
        Unit.NONE, Domain.NONNEGATIVE, healthy=(0.1, 10.0),
        what_to_check="Exploding gradients: check for NaN inputs, the learning rate and the "
        "loss scale; under DeepSpeed 0.13.5-0.14.0 a NaN norm is a known bug.",
        alerts=(AlertSpec("GradNormHigh", WARN, Comparison.GT, 10.0, for_steps=3,
                          summary="Gradient norm above 10", resolve_after=RESOLVE_AFTER,
                          critical=1e3),),
        panel=_panel("overview", "Optimisation", 50),
    ),
    MetricSpec(LR, "Learning rate.", VALUE, Unit.NONE, Domain.NONNEGATIVE,
               panel=_panel("overview", "Optimisation", 60)),
    MetricSpec(LOSS_SCALE, "DeepSpeed fp16 dynamic loss scale.", VALUE,
               Unit.NONE, Domain.NONNEGATIVE,
               what_to_check="A collapsing loss scale means repeated fp16 overflows.",
               panel=_panel("overview", "Optimisation", 70)),
    MetricSpec(SKIPPED_STEPS, "Optimizer steps skipped by DeepSpeed (overflow).", VALUE,
               Unit.STEPS, Domain.NONNEGATIVE, panel=_panel("overview", "Optimisation", 80)),
    MetricSpec(PPO_RATIO, "Token-mean PPO ratio pi_theta / pi_old.", MEAN,
               Unit.NONE, Domain.NONNEGATIVE, healthy=(0.8, 1.2),
               panel=_panel("overview", "Optimisation", 85)),
    MetricSpec(ADVANTAGE, "Token-mean advantage over loss tokens.", MEAN,
               panel=_panel("overview", "Optimisation", 90)),
    MetricSpec(ADVANTAGE_STD, "Standard deviation of advantages over loss tokens.",
               MOMENTS, Unit.NONE, Domain.NONNEGATIVE,
               panel=_panel("overview", "Optimisation", 95)),
    # --- rollout <-> trainer mismatch -----------------------------------------------------------
    MetricSpec(
        IS_RATIO,
        "Token-mean importance ratio exp(logp_trainer_old - logp_rollout).", MEAN,
        Unit.NONE, Domain.NONNEGATIVE, healthy=(0.8, 1.25),
        what_to_check="Rollout and trainer policies disagree: check weight sync to the rollout "
        "engine, its dtype and sampling parameters, and the IS correction.",
        alerts=(AlertSpec("ISRatioDivergence", CRIT, Comparison.OUTSIDE, 0.5, 2.0,
                          summary="Token-mean IS ratio outside [0.5, 2.0]",
                          resolve_after=RESOLVE_AFTER),),
        panel=_panel("overview", "Rollout / trainer mismatch", 10), samples=IS_RATIO_LOWEST,
    ),
    MetricSpec(
        IS_RATIO_MIN, "Smallest token importance ratio in the step.", MIN,
        Unit.NONE, Domain.NONNEGATIVE,
        what_to_check="Some tokens come from a stale policy: check the policy lag and weight sync.",
        # one token's ratio is one token's luck: three steps in a row below 0.1 is staleness
        # (a steady one-step-off-policy run's noise dips below it a step at a time)
        alerts=(AlertSpec("ISRatioStale", WARN, Comparison.LT, 0.1, for_steps=3,
                          summary="Smallest IS ratio below 0.1 for 3 steps in a row",
                          resolve_after=RESOLVE_AFTER),),
        panel=_panel("overview", "Rollout / trainer mismatch", 20), samples=IS_RATIO_LOWEST,
    ),
    MetricSpec(IS_RATIO_MAX, "Largest token importance ratio in the step.", MAX,
               Unit.NONE, Domain.NONNEGATIVE,
               panel=_panel("overview", "Rollout / trainer mismatch", 30)),
    MetricSpec(
        LOGP_DIFF, "Token-mean abs(logp_trainer_old - logp_rollout).", MEAN,
        Unit.NATS, Domain.NONNEGATIVE, healthy=(0.0, 0.05),
        what_to_check="Trainer and rollout log-probabilities disagree: dtype, kernels, or "
        "weights out of sync.",
        alerts=(
            # a steady one-step-off-policy run sits at 0.09-0.11: once fired, it resolves
            # under 0.08 (a margin of 0.02), not each time the noise dips under 0.1; and two
            # steps: a mismatch of dtype, kernels or weights shows on every step, one batch's
            # mean of a small batch jumps past 0.1 by itself now and then
            AlertSpec("LogprobMismatch", WARN, Comparison.GT, 0.1, for_steps=2,
                      summary="Token-mean logprob difference above 0.1 for 2 steps",
                      resolve_after=RESOLVE_AFTER, critical=0.3, resolve_margin=0.02),
            AlertSpec("LogprobDivergence", CRIT, Comparison.GT, 1.0,
                      summary="Token-mean logprob difference above 1.0",
                      resolve_after=RESOLVE_AFTER),
        ),
        panel=_panel("overview", "Rollout / trainer mismatch", 40), samples=LOGP_DIFF_WORST,
    ),
    MetricSpec(LOGP_DIFF_MAX, "Worst token abs(logp_trainer_old - logp_rollout).", MAX,
               Unit.NATS, Domain.NONNEGATIVE,
               panel=_panel("overview", "Rollout / trainer mismatch", 50),
               samples=LOGP_DIFF_WORST),
    MetricSpec(IS_MASKED_FRAC,
               "Fraction of tokens masked or truncated by the IS correction.", MEAN,
               Unit.RATIO, Domain.FRACTION, healthy=(0.0, 0.05),
               panel=_panel("overview", "Rollout / trainer mismatch", 60)),
    MetricSpec(
        LOGP_DIFF_WORST, "The sequences with the largest mean abs(logp_trainer_old - "
        "logp_rollout) over their tokens (top-k with ids and payloads; the value is the worst "
        "sequence's mean).", TOP, Unit.NATS, Domain.NONNEGATIVE,
        what_to_check="`rlmon samples RUN --role actor` shows which sequences disagree: one "
        "prompt template, a tokenizer mismatch, long truncated responses, or every sequence.",
        panel=_panel("overview", "Rollout / trainer mismatch", 70)),
    MetricSpec(
        IS_RATIO_LOWEST, "The sequences with the smallest token importance ratio (bottom-k with "
        "ids and payloads; the value is the lowest ratio).", BOTTOM, Unit.NONE,
        Domain.NONNEGATIVE,
        what_to_check="`rlmon samples RUN --role actor` shows the sequences generated by the "
        "stalest policy.",
        panel=_panel("overview", "Rollout / trainer mismatch", 80)),
    # --- critic -------------------------------------------------------------------------------
    MetricSpec(CRITIC_LOSS, "Critic (value) loss, token-weighted.", MEAN,
               panel=_panel("overview", "Critic", 10)),
    MetricSpec(CRITIC_VALUE, "Token-mean value estimate.", MEAN,
               panel=_panel("overview", "Critic", 20)),
    MetricSpec(CRITIC_CLIP_RATIO, "Fraction of value estimates clipped.", MEAN,
               Unit.RATIO, Domain.FRACTION, panel=_panel("overview", "Critic", 30)),
    MetricSpec(CRITIC_GRAD_NORM, "Critic gradient norm before clipping.", NORM,
               Unit.NONE, Domain.NONNEGATIVE, panel=_panel("overview", "Critic", 40)),
    MetricSpec(CRITIC_RETURNS, "Token-mean return.", MEAN,
               panel=_panel("overview", "Critic", 50)),
    MetricSpec(CRITIC_LR, "Critic learning rate.", VALUE, Unit.NONE, Domain.NONNEGATIVE,
               panel=_panel("overview", "Critic", 60)),
    # --- rollout ------------------------------------------------------------------------------
    MetricSpec(
        REWARD, "Mean reward per response.", MEAN,
        what_to_check="Reward is flat at zero: check the reward function and the answer parser.",
        alerts=(AlertSpec("RewardStuck", WARN, Comparison.ABS_LT, 1e-9, for_steps=20,
                          summary="Mean reward stuck at zero", resolve_after=RESOLVE_AFTER,
                          escalate_after=100),),
        panel=_panel("overview", "Reward", 10), samples=REWARD_LOWEST,
    ),
    MetricSpec(REWARD_STD, "Standard deviation of rewards over responses.", MOMENTS,
               Unit.NONE, Domain.NONNEGATIVE, panel=_panel("overview", "Reward", 20)),
    MetricSpec(REWARD_MIN, "Smallest reward in the step.", MIN,
               panel=_panel("overview", "Reward", 30), samples=REWARD_LOWEST),
    MetricSpec(REWARD_MAX, "Largest reward in the step.", MAX,
               panel=_panel("overview", "Reward", 40), samples=REWARD_HIGHEST),
    MetricSpec(
        FRAC_REWARD_ZERO_STD, "Fraction of prompt groups whose rewards all tie.", MEAN,
        Unit.RATIO, Domain.FRACTION, healthy=(0.0, 0.5),
        what_to_check="No group has a reward spread, so GRPO advantages are zero: the task is too "
        "easy or too hard, or the reward is broken.",
        alerts=(AlertSpec("NoLearningSignal", CRIT, Comparison.GE, 0.99, for_steps=3,
                          summary="Almost every prompt group has tied rewards",
                          resolve_after=RESOLVE_AFTER),),
        panel=_panel("overview", "Reward", 50),
    ),
    MetricSpec(REWARD_HIGHEST, "The responses with the highest reward (top-k with ids and "
               "payloads; the value is the highest reward).", TOP,
               what_to_check="Read them for reward hacking.",
               panel=_panel("overview", "Reward", 60)),
    MetricSpec(REWARD_LOWEST, "The responses with the lowest reward (bottom-k with ids and "
               "payloads; the value is the lowest reward).", BOTTOM,
               what_to_check="Read them for a broken reward function or answer parser.",
               panel=_panel("overview", "Reward", 70)),
    # a score the policy is not trained on (a verifier, a held-out reward model, the reward on
    # held-out prompts): RewardHacking watches the training reward's gap to it
    MetricSpec(VERIFIER_SCORE, "Mean held-out or verifier score of the step's responses (a score "
               "the policy is not trained on), on the reward's scale.", MEAN,
               what_to_check="The training reward pulls away from it: see RewardHacking.",
               panel=_panel("overview", "Reward", 75)),
    MetricSpec(RESPONSE_LENGTH, "Mean response length.", MEAN,
               Unit.TOKENS, Domain.NONNEGATIVE, panel=_panel("overview", "Rollout", 10),
               what_to_check="Responses grow longer than the run's own trend: read the longest "
               "(rollout/truncated_longest) for loops, repetition or padding, check the reward "
               "for a length bonus (with the reward and KL climbing too: RewardHacking), and "
               "whether they reach the generation limit (the cap: max_completion_length, "
               "max_response_length, max_new_tokens); a mean pinned at the cap is every "
               "completion cut there.",
               samples=TRUNCATED_LONGEST),
    MetricSpec(RESPONSE_LENGTH_MAX, "Longest response in the step.", MAX,
               Unit.TOKENS, Domain.NONNEGATIVE, panel=_panel("overview", "Rollout", 20)),
    MetricSpec(PROMPT_LENGTH, "Mean prompt length.", MEAN,
               Unit.TOKENS, Domain.NONNEGATIVE, panel=_panel("overview", "Rollout", 25)),
    MetricSpec(
        CLIPPED_RATIO, "Fraction of responses that hit the length limit.", MEAN,
        Unit.RATIO, Domain.FRACTION, healthy=(0.0, 0.2),
        what_to_check="Responses run into max length: raise the limit or penalise length.",
        alerts=(AlertSpec("CompletionsTruncated", WARN, Comparison.GT, 0.8, for_steps=3,
                          summary="Most completions truncated at the length limit",
                          resolve_after=RESOLVE_AFTER, critical=0.95),),
        panel=_panel("overview", "Rollout", 30), samples=TRUNCATED_LONGEST,
    ),
    MetricSpec(TRUNCATED_LONGEST, "The longest responses that hit the length limit (top-k by "
               "length in tokens, with ids and payloads; the value is the longest).", TOP,
               Unit.TOKENS, Domain.NONNEGATIVE,
               what_to_check="Read them for loops and run-on answers.",
               panel=_panel("overview", "Rollout", 35)),
    MetricSpec(POLICY_LAG,
               "Trainer step minus the weights version used to generate.", MAX,
               Unit.STEPS, Domain.NONNEGATIVE, panel=_panel("overview", "Rollout", 40)),
    MetricSpec(TOKENS, "Tokens generated in the step.", SUM,
               Unit.TOKENS, Domain.NONNEGATIVE, panel=_panel("rollout", "Throughput", 10)),
    MetricSpec(SAMPLES, "Responses generated in the step.", SUM,
               Unit.NONE, Domain.NONNEGATIVE, panel=_panel("rollout", "Throughput", 20)),
    MetricSpec(TOKENS_PER_SECOND,
               "Generation throughput summed over rollout engines.", SUM,
               Unit.TOKENS_PER_SECOND, Domain.NONNEGATIVE,
               panel=_panel("rollout", "Throughput", 30)),
    MetricSpec(NUM_RUNNING_REQS,
               "Requests running: each engine's mean over its scheduler iterations in the step, "
               "summed over engines.", SUM,
               Unit.REQUESTS, Domain.NONNEGATIVE, panel=_panel("rollout", "Engine", 10)),
    MetricSpec(NUM_RUNNING_REQS_MAX,
               "Most requests running on one engine in any scheduler iteration of the step.", MAX,
               Unit.REQUESTS, Domain.NONNEGATIVE, panel=_panel("rollout", "Engine", 15)),
    MetricSpec(NUM_WAITING_REQS,
               "Requests waiting: each engine's mean over its scheduler iterations in the step, "
               "summed over engines.", SUM,
               Unit.REQUESTS, Domain.NONNEGATIVE, panel=_panel("rollout", "Engine", 20)),
    MetricSpec(NUM_WAITING_REQS_MAX,
               "Most requests waiting on one engine in any scheduler iteration of the step.", MAX,
               Unit.REQUESTS, Domain.NONNEGATIVE, panel=_panel("rollout", "Engine", 25)),
    MetricSpec(KV_CACHE_USAGE,
               "KV-cache usage, mean over every engine's scheduler iterations in the step.", MEAN,
               Unit.RATIO, Domain.FRACTION, panel=_panel("rollout", "Engine", 30)),
    MetricSpec(KV_CACHE_USAGE_MAX,
               "Highest KV-cache usage of any engine in any scheduler iteration of the step.", MAX,
               Unit.RATIO, Domain.FRACTION, panel=_panel("rollout", "Engine", 35)),
    MetricSpec(PREEMPTIONS, "Requests preempted, summed over engines.", SUM,
               Unit.REQUESTS, Domain.NONNEGATIVE, panel=_panel("rollout", "Engine", 40)),
    MetricSpec(PREFIX_CACHE_HIT_RATE,
               "Prefix-cache hits over queries, pooled over engines.", MEAN,
               Unit.RATIO, Domain.FRACTION, panel=_panel("rollout", "Engine", 50)),
    # --- performance --------------------------------------------------------------------------
    MetricSpec(STEP_SECONDS, "Wall time of the step (the slowest rank).", MAX,
               Unit.SECONDS, Domain.NONNEGATIVE, per_rank_spread=True,
               panel=_panel("overview", "Performance", 10)),
    MetricSpec(STRAGGLER_RATIO,
               "Slowest rank's step time over the median rank's (derived by the aggregator).",
               VALUE, Unit.NONE, Domain.NONNEGATIVE,
               panel=_panel("overview", "Performance", 20)),
    MetricSpec(GENERATE_SECONDS, "Time spent generating rollouts.", MAX,
               Unit.SECONDS, Domain.NONNEGATIVE, panel=_panel("overview", "Performance", 30)),
    MetricSpec(REFERENCE_SECONDS, "Time spent on reference log-probabilities.", MAX,
               Unit.SECONDS, Domain.NONNEGATIVE, panel=_panel("overview", "Performance", 40)),
    MetricSpec(REWARD_SECONDS, "Time spent computing rewards.", MAX,
               Unit.SECONDS, Domain.NONNEGATIVE, panel=_panel("overview", "Performance", 50)),
    MetricSpec(TRAIN_SECONDS, "Time spent in the policy update.", MAX,
               Unit.SECONDS, Domain.NONNEGATIVE, panel=_panel("overview", "Performance", 60)),
    MetricSpec(WEIGHT_SYNC_SECONDS, "Time spent syncing weights to rollout engines.",
               MAX, Unit.SECONDS, Domain.NONNEGATIVE,
               panel=_panel("overview", "Performance", 70)),
    MetricSpec(MEMORY_ALLOCATED_BYTES, "Peak device memory allocated (worst rank).", MAX,
               Unit.BYTES, Domain.NONNEGATIVE, panel=_panel("overview", "Performance", 80)),
    MetricSpec(MEMORY_RESERVED_BYTES, "Peak device memory reserved (worst rank).", MAX,
               Unit.BYTES, Domain.NONNEGATIVE, panel=_panel("overview", "Performance", 90)),
    # --- hardware, sampled per rank off the training thread (rlmon.actors.reporter.hardware) ----------
    MetricSpec(GPU_UTILIZATION,
               "GPU utilisation (NVML), mean over the step's samples of every rank's GPU.", MEAN,
               Unit.RATIO, Domain.FRACTION, panel=_panel("overview", "Hardware", 10)),
    MetricSpec(GPU_POWER_WATTS,
               "GPU power draw (NVML), mean over the step's samples of every rank's GPU.", MEAN,
               Unit.WATTS, Domain.NONNEGATIVE, panel=_panel("overview", "Hardware", 20)),
    MetricSpec(HOST_RSS_BYTES, "Peak resident memory of a rank's process (worst rank).", MAX,
               Unit.BYTES, Domain.NONNEGATIVE, panel=_panel("overview", "Hardware", 30)),
    MetricSpec(HOST_CPU_CORES,
               "CPU cores busy in a rank's process, mean over the step's samples and ranks.",
               MEAN, Unit.NONE, Domain.NONNEGATIVE, panel=_panel("overview", "Hardware", 40)),
)

CATALOG: Mapping[str, MetricSpec] = MappingProxyType({spec.name: spec for spec in _SPECS})

STRAGGLER_SOURCE = STEP_SECONDS
STRAGGLER_METRIC = STRAGGLER_RATIO
# StragglerRank (condition straggler_rank): for `for_steps` steps in a row the same rank is the
# slowest, by more than `threshold` times the median rank's step time (from the ranks'
# timelines); the notification names the rank and the span that made it slow.
STRAGGLER_ALERT = AlertSpec(
    "StragglerRank", WARN, Comparison.GT, 1.5, for_steps=5, resolve_after=RESOLVE_AFTER,
    summary="The same rank is the slowest, by more than 1.5x the median rank, step after step")

# Early-warning rules (severity warning): each metric against its run's own trailing baseline
# (rlmon.service.alerting.baseline), for the failures that are slow before they are fatal. Parameters were
# tuned on bench/bench_detection.py's tuning seeds 0-299 (at most one false-alarm episode per rule
# in their ~850,000 healthy steps, two for the gradient norm; then the fastest gradual detection)
# and are judged on its held-out seeds 6000-6023; the figures are in docs/early-warning.md.
EARLY_WARNINGS: tuple[BaselineSpec, ...] = (
    # entropy is positive and its noise scales with its level: judged on a log scale
    BaselineSpec("EntropySliding", ENTROPY,
                 BaselineParams("down", window=60, allowance=3, decision=3.5,
                                relative_floor=0.03, log_offset=1e-4),
                 summary="Policy entropy sliding below the run's own baseline",
                 level_rule="EntropyCollapse", critical_drop=0.9),
    # three steps however far out: a batch of unusual prompts spikes the KL for a step, and
    # two such steps in a row come by chance (a pair in one of 11 runs at a 1.5% spike rate)
    BaselineSpec("KLClimbing", KL,
                 BaselineParams("up", window=60, allowance=2.5, decision=10, log_offset=0.02,
                                spike_steps=3),
                 summary="KL to the reference climbing above the run's own baseline",
                 level_rule="KLDivergence"),
    BaselineSpec("LogprobMismatchClimbing", LOGP_DIFF,
                 BaselineParams("up", window=60, allowance=2, decision=16, log_offset=0.005,
                                follow_drift=False),
                 summary="Trainer/rollout logprob difference climbing above its baseline",
                 level_rule="LogprobMismatch"),
    # two steps over: two gradient spikes in a row are common and not yet a blow-up
    BaselineSpec("GradNormBlowingUp", GRAD_NORM,
                 BaselineParams("up", window=60, allowance=3, decision=3, log_offset=0.01,
                                follow_drift=False),
                 summary="Gradient norm blowing up from the run's own baseline", for_steps=2,
                 level_rule="GradNormHigh"),
    BaselineSpec("ClipRatioClimbing", CLIP_RATIO,
                 BaselineParams("up", window=30, allowance=2, decision=8, floor=0.01,
                                relative_floor=0.1),
                 summary="PPO clip ratio climbing above the run's own baseline",
                 level_rule="ClipRatioHigh"),
    BaselineSpec("ResponseLengthRunaway", RESPONSE_LENGTH,
                 BaselineParams("up", window=30, allowance=2.5, decision=6,
                                relative_floor=0.03),
                 summary="Response length running away towards the length limit",
                 level_rule="CompletionsTruncated", critical_pinned=5),
    BaselineSpec("RewardCollapsing", REWARD,
                 BaselineParams("down", window=60, allowance=1.5, decision=8, floor=0.02),
                 summary="Mean reward collapsing below the run's own baseline",
                 level_rule="RewardStuck"),
    # the share of prompt groups whose completions all scored alike: no advantage, no gradient
    BaselineSpec("LearningSignalFading", FRAC_REWARD_ZERO_STD,
                 BaselineParams("up", window=60, allowance=2, decision=10, floor=0.01,
                                relative_floor=0.0),
                 summary="More prompt groups without reward variance than the run's baseline",
                 level_rule="NoLearningSignal"),
    # lag is a whole number of steps: one step of jitter is the floor of its scale; a healthy
    # asynchronous run's lag has no drift, so the baseline is a level
    BaselineSpec("PolicyLagGrowing", POLICY_LAG,
                 BaselineParams("up", window=60, allowance=1.0, decision=2, floor=1.0,
                                relative_floor=0.0, follow_drift=False),
                 summary="Rollouts ever staler: policy lag growing (asynchronous runs)",
                 for_steps=2),  # two steps over: a queue's jitter of 2 whole steps is not growth
)


# Why a warning of the default pack has no critical level (AlertSpec.critical, .escalate_after):
# every default rule is critical, escalates, or says why not here (docs/alerting.md's table).
_EARLY = "an early warning, judged against the run's own past: "
NO_CRITICAL: Mapping[str, str] = MappingProxyType({
    "ISRatioStale": "one stale token's ratio is not damage; the token mean's ISRatioDivergence "
    "is the critical level",
    "StragglerRank": "a slow rank costs time, not the run's correctness; RunStalled pages when "
    "it stops progress",
    "StageStuck": "a hang seen early; RunStalled pages once progress stops",
    "StepTimeRegression": "slower steps cost time, not correctness; RunStalled pages when steps "
    "stop",
    "RunPreempted": "stopped from outside (a scheduler or a person), nothing broke: resubmitting "
    "resolves it; RunFailed is the critical alert for a crash",
    "RunFrozen": "the processes live and may resume (SIGCONT, a debugger); RunStalled pages "
    "(critical) once it is silent past the stall threshold",
    "KLClimbing": _EARLY + "KLDivergence judges the level and is critical from 10",
    "LogprobMismatchClimbing": _EARLY + "LogprobMismatch is critical from 0.3, "
    "LogprobDivergence at 1.0",
    "GradNormBlowingUp": _EARLY + "GradNormHigh judges the level and is critical from 1e3",
    "ClipRatioClimbing": _EARLY + "ClipRatioHigh judges the level and is critical from 0.5",
    "RewardCollapsing": _EARLY + "a harder curriculum lowers the reward too; RewardStuck "
    "escalates a reward gone flat",
    "LearningSignalFading": _EARLY + "NoLearningSignal (critical) judges the level",
    "PolicyLagGrowing": _EARLY + "staler rollouts waste compute slowly; ISRatioDivergence "
    "(critical) pages when the staleness breaks the update",
    "RewardHacking": _EARLY + "whether the reward is gamed needs a person to read the samples; "
    "a critical page would be a guess",
})


# Liveness alerts (rlmon.service.liveness, docs/liveness.md): judged by time on the
# aggregator's clock, so a run that produces no step can still page. The thresholds are the
# config's `liveness` section; the alert texts say where each rank is and what the stall cost.
LIVENESS_ALERTS: tuple[LivenessAlertSpec, ...] = (
    LivenessAlertSpec(
        "RunStalled", CRIT, "run_stalled",
        "No step finalized for longer than the run's stall threshold while its ranks are alive",
        "Look first at the ranks the alert names as in a different stage from the rest: the "
        "rank that never entered the collective, the stuck rollout engine, the reward server "
        "that stopped answering. py-spy dump --pid PID on that rank shows the stack; NCCL hangs "
        "show with NCCL_DEBUG=INFO and TORCH_NCCL_ASYNC_ERROR_HANDLING=1 turns them into errors."),
    LivenessAlertSpec(
        "StageStuck", WARN, "stage_stuck",
        "One rank far past its usual time in a stage while the other ranks wait",
        "The named rank is stuck in the named stage (a hang seen before the stall threshold): "
        "dump its stack (py-spy dump), check its node (GPU Xid errors in dmesg, NIC, disk) and "
        "whatever the stage waits on (the rollout engine, the reward server, a weight sync)."),
    LivenessAlertSpec(
        "RunDied", CRIT, "run_died",
        "Every Reporter of the run went silent without closing, and its processes are gone or "
        "cannot be seen (killed, crashed without a word, node lost)",
        "The alert says whether the processes are gone or could not be checked (a process on a "
        "node rlmon cannot see). Gone: check the driver's exit (OOM killer in dmesg, the "
        "scheduler's eviction or preemption events, ray status for lost nodes) and restart from "
        "the last checkpoint. Not checked: look for the processes first (ps, ray list workers); "
        "alive means frozen, not dead. Some ranks gone while steps still finalize is "
        "RankMissing instead."),
    LivenessAlertSpec(
        "RunFailed", CRIT, "run_failed",
        "A rank's process ended by an uncaught exception, a non-zero exit or a fatal signal",
        "The alert names the ranks, the exception and the stage each was in: CUDA out of memory "
        "(lower the micro-batch, max_num_batched_tokens or gpu_memory_utilization), an NCCL "
        "error (NCCL_DEBUG=INFO, the node's NIC and GPU Xid errors in dmesg), a bad batch or a "
        "reward function that raised (the traceback's last frames). Fix, then rerun from the "
        "last checkpoint under the same run name: the rerun resolves this alert."),
    LivenessAlertSpec(
        "RunPreempted", WARN, "run_preempted",
        "The run's processes were stopped by a signal from outside (SIGTERM, SIGINT, SIGHUP)",
        "A scheduler's preemption or eviction (SLURM, Kubernetes, spot instances) or a person "
        "stopped the run. Check the scheduler's events for why, and resubmit from the last "
        "checkpoint: the rerun resolves this alert. A run preempted often wants a checkpoint "
        "on SIGTERM and a shorter checkpoint interval."),
    LivenessAlertSpec(
        "RunFrozen", WARN, "run_frozen",
        "Every Reporter of the run went silent, but its processes still exist",
        "The processes are alive but cannot even heartbeat: stopped (SIGSTOP, Ctrl-Z; ps shows "
        "state T), paused in a debugger, or a native call holding the GIL. py-spy dump --pid "
        "PID shows where; kill -CONT PID resumes a stopped one. If it stays silent past the "
        "stall threshold RunStalled pages too."),
    LivenessAlertSpec(
        "StepTimeRegression", WARN, "step_time_regression",
        "Step time far above the run's own baseline while the run still progresses",
        "Compare the step timelines (rlmon trace RUN) before and after: a slow node or GPU "
        "(thermal throttling, a degraded NIC), memory pressure or swapping, a longer generation "
        "length, or a new evaluation inside the step."),
)


def sample_metrics() -> Iterator[MetricSpec]:
    """The ranked metrics (top/bottom forms): per step, the worst samples with ids and payloads."""
    return (spec for spec in _SPECS if spec.forms[0] in (Form.TOP, Form.BOTTOM))


def samples_for(metric: str) -> str | None:
    """The sample metric whose items explain ``metric``'s alerts (None: it has none)."""
    spec = CATALOG.get(metric)
    return spec.samples or None if spec is not None else None


def metrics() -> Iterator[MetricSpec]:
    """Iterate over the catalog in declaration order."""
    return iter(_SPECS)


def lookup(name: str) -> MetricSpec | None:
    """The spec of a canonical metric, or None for a user-defined one."""
    return CATALOG.get(name)


def form_error(name: str, form: Form) -> str | None:
    """Why ``form`` cannot carry ``name`` (the catalog gives the name other forms), or None."""
    spec = CATALOG.get(name)
    if spec is None or form in spec.forms:
        return None
    allowed = " or ".join(repr(f.value) for f in spec.forms)
    return f"sends form {form.value!r} but the catalog defines {allowed}"


def get(name: str) -> MetricSpec:
    """The spec of a canonical metric; KeyError names the metric when it is not in the catalog."""
    try:
        return CATALOG[name]
    except KeyError:
        raise KeyError(f"metric {name!r} is not in the rlmon catalog") from None
