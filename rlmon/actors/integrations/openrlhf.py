"""OpenRLHF: a logger beside its W&B/TensorBoard loggers, an exact driver-side IS hook, a worker path.

OpenRLHF (v0.11.0) has no callback system; its controller builds ``WandbLogger`` and
``TensorboardLogger`` (``openrlhf/utils/logging_utils.py``) and calls ``log_train(global_step,
logs)``, ``log_eval(global_step, logs)`` and ``close()``. :class:`RlmonLogger` has that shape.

- The logger relays the controller's merged status dict. Keys whose OpenRLHF reduction is exact
  (``ppo_clip_ratio``, ``ppo_kl``, driver-side ``rollout/*``) go under canonical names; the loss
  keys (normalized per accumulation window, then token-weighted again) go under
  ``openrlhf/<key>`` and are flagged not comparable.
- :meth:`RlmonLogger.record_experiences` is the driver-side hook after experience making: it
  computes the global IS ratio exp(old_logp - rollout_logp) (mean, min, max), the log-prob
  difference and the fraction of tokens the IS correction truncates or masks, which OpenRLHF
  builds inside ``PolicyLoss.forward`` and discards; and the worst sequences by mismatch
  (``actor/logp_diff_worst``, ``actor/is_ratio_lowest``), ranked on the tensors' device, with
  the text of the selected few when ``sample_payload`` decodes it.
- :class:`WorkerPath` runs in ``ActorPPOTrainer.ppo_train`` and sends per-rank sufficient
  statistics from SP/TP replica leaders only, so replicas are never counted twice.

The stop switch (``rlmon.service.contract.stop_decision``): OpenRLHF has no stop hook. Check
``logger.reporter.should_stop()`` on the driver after ``log_train`` (in ``PPOTrainer.fit``, after
``save_logs_and_checkpoints`` of the step) and leave the loop after saving a checkpoint; it reads
the last acknowledgement and never waits, and the driver's decision ends the step loop for every
worker at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from rlmon.actors.integrations._base import (
    ReporterLike,
    as_float64,
    end_training,
    framework_version,
    make_reporter,
    plan_steps,
    record_mismatch_samples,
    relay,
    send_run_info,
)
from rlmon.service.metrics import catalog

__all__ = ["RlmonLogger", "WorkerPath", "attach", "importance_stats"]

FRAMEWORK = "openrlhf"
IS_MODES = ("tis", "icepop", "seq-mask-tis")


def importance_stats(
    old_logp: Any,
    rollout_logp: Any,
    mask: Any,
    *,
    low: float = 0.5,
    high: float = 5.0,
    mode: str = "tis",
) -> dict[str, float]:
    """Sufficient statistics of rho = exp(old - rollout) over the masked tokens of one batch.

    Returns sums and counts (never means) so batches and steps pool exactly. ``masked`` counts
    the tokens the correction changes: clamped (tis), zeroed (icepop), or in a sequence whose
    geometric-mean ratio leaves [low, high] (seq-mask-tis), as in ``openrlhf/models/loss.py``
    (v0.11: ``is_correction_level=token`` with ``is_correction_mode=clip`` / ``mask``, and
    ``level=seq`` with ``mode=mask``, ratio gating). At token level the fraction equals
    OpenRLHF's ``is_filter_ratio``; at seq level OpenRLHF counts sequences, rlmon their tokens.
    """
    if mode not in IS_MODES:
        raise ValueError(f"mode must be one of {IS_MODES}, got {mode!r}")
    old, roll, m = as_float64(old_logp), as_float64(rollout_logp), as_float64(mask) > 0
    if old.shape != roll.shape or old.shape != m.shape:
        raise ValueError(f"shapes differ: old {old.shape}, rollout {roll.shape}, mask {m.shape}")
    log_ratio = old - roll
    tokens = int(m.sum())
    out = {"tokens": float(tokens), "ratio_sum": 0.0, "diff_sum": 0.0, "masked": 0.0}
    if tokens == 0:
        return out
    lr = log_ratio[m]
    ratio = np.exp(lr)
    out["ratio_sum"] = float(ratio.sum())
    out["ratio_min"] = float(ratio.min())
    out["ratio_max"] = float(ratio.max())
    out["diff_sum"] = float(np.abs(lr).sum())
    out["diff_max"] = float(np.abs(lr).max())
    if mode == "seq-mask-tis":
        lr2 = np.atleast_2d(np.where(m, log_ratio, 0.0))
        m2 = np.atleast_2d(m)
        n = m2.sum(axis=-1)
        geo = np.exp(lr2.sum(axis=-1) / np.maximum(n, 1))
        bad = (n > 0) & ((geo < low) | (geo > high))
        out["masked"] = float(n[bad].sum())
    else:
        out["masked"] = float(((ratio < low) | (ratio > high)).sum())
    return out


def record_importance(reporter: ReporterLike, stats: Mapping[str, float]) -> None:
    """Record :func:`importance_stats` output under the canonical IS names."""
    tokens = stats["tokens"]
    if tokens <= 0:
        return
    reporter.record(catalog.IS_RATIO, sum=stats["ratio_sum"], count=tokens)
    reporter.record(catalog.IS_RATIO_MIN, min=stats["ratio_min"])
    reporter.record(catalog.IS_RATIO_MAX, max=stats["ratio_max"])
    reporter.record(catalog.LOGP_DIFF, sum=stats["diff_sum"], count=tokens)
    reporter.record(catalog.LOGP_DIFF_MAX, max=stats["diff_max"])
    reporter.record(catalog.IS_MASKED_FRAC, sum=stats["masked"], count=tokens)


class RlmonLogger:
    """A third logger next to OpenRLHF's ``WandbLogger`` / ``TensorboardLogger``.

    Metrics recorded by the driver hook between two ``log_train`` calls join the step that
    ``log_train`` ends (with ``logger.logging_steps > 1`` they pool over the unlogged steps,
    still exactly).
    """

    def __init__(
        self,
        run: str,
        *,
        reporter: ReporterLike | None = None,
        eval_reporter: ReporterLike | None = None,
        role: str = "driver",
        is_low: float = 0.5,
        is_high: float = 5.0,
        is_mode: str = "tis",
        samples_k: int = 8,
        sample_payload: Callable[[Any, int], str] | None = None,
        **reporter_kw: Any,
    ) -> None:
        """``sample_payload(experience, i)``: the text of sequence ``i`` of an experience
        (e.g. the tokenizer's decode of ``experience.sequences[i]``), asked only for the worst
        ``samples_k``; without it samples carry no text."""
        self.run = run
        self.samples_k, self.sample_payload = samples_k, sample_payload
        self.reporter = reporter or make_reporter(run, role, **reporter_kw)
        # the service names OpenRLHF's flags in what to change (rlmon.service.metrics.remedies)
        self.run_info = send_run_info(self.reporter, framework=FRAMEWORK,
                                      framework_version=framework_version(FRAMEWORK))
        self.eval_reporter = eval_reporter
        self._eval_kw = reporter_kw
        self.is_low, self.is_high, self.is_mode = is_low, is_high, is_mode
        self.published: dict[str, str] = {}

    def log_train(self, global_step: int, logs_dict: Mapping[str, Any]) -> None:
        self.published.update(relay(self.reporter, FRAMEWORK, logs_dict))
        self.reporter.end_step(int(global_step))

    def log_eval(self, global_step: int, logs_dict: Mapping[str, Any]) -> None:
        if self.eval_reporter is None:
            self.eval_reporter = make_reporter(self.run, "eval", **self._eval_kw)
        relay(self.eval_reporter, FRAMEWORK, logs_dict, prefix="eval/")
        self.eval_reporter.end_step(int(global_step))

    def record_experiences(self, experiences: Iterable[Any]) -> None:
        """Driver hook after ``make_experience_batch``: exact IS statistics over every sample.

        Needs ``rollout_log_probs`` (OpenRLHF requests vLLM log-probs only with
        ``--algo.advantage.is_correction_level``); experiences without them are skipped.
        """
        total: dict[str, float] = {}
        for exp in experiences:
            rollout = getattr(exp, "rollout_log_probs", None)
            if rollout is None:
                continue
            s = importance_stats(exp.action_log_probs, rollout, exp.action_mask,
                                 low=self.is_low, high=self.is_high, mode=self.is_mode)
            if s["tokens"] == 0:
                continue
            record_mismatch_samples(
                self.reporter, exp.action_log_probs - rollout, exp.action_mask,
                k=self.samples_k, payload=self._payload_of(exp))
            if not total:
                total = dict(s)
                continue
            for key in ("tokens", "ratio_sum", "diff_sum", "masked"):
                total[key] += s[key]
            total["ratio_min"] = min(total["ratio_min"], s["ratio_min"])
            total["ratio_max"] = max(total["ratio_max"], s["ratio_max"])
            total["diff_max"] = max(total["diff_max"], s["diff_max"])
        if total:
            record_importance(self.reporter, total)

    def _payload_of(self, experience: Any) -> Callable[[int], str] | None:
        describe = self.sample_payload
        if describe is None:
            return None
        return lambda i: describe(experience, i)

    def close(self) -> None:
        end_training(self.reporter, self.eval_reporter)


def attach(trainer: Any, run: str, **kw: Any) -> RlmonLogger:
    """Hook a ``BasePPOTrainer`` (v0.11.0): log beside its loggers and after experience making.

    Wraps ``trainer.save_logs_and_checkpoints(global_step, logs, ...)`` (where OpenRLHF calls its
    loggers) and ``trainer.experience_maker.make_experience_batch`` (``ppo_trainer.py``); says
    the planned steps (``trainer.get_max_steps()`` where the trainer has it, else its
    ``max_steps``) and closes the Reporters when ``trainer.fit`` returns (the end of training;
    a ``fit`` that raises closes them saying so).
    """
    logger = RlmonLogger(run, **kw)
    planned = getattr(trainer, "get_max_steps", None)
    plan_steps(logger.reporter, planned() if callable(planned)
               else getattr(trainer, "max_steps", None))
    fit = getattr(trainer, "fit", None)
    if callable(fit):
        def fit_then_close(*args: Any, **kwargs: Any) -> Any:
            try:
                return fit(*args, **kwargs)
            finally:
                logger.close()

        trainer.fit = fit_then_close
    save = trainer.save_logs_and_checkpoints

    def save_logs_and_checkpoints(global_step: int, logs: Any, *args: Any, **kwargs: Any) -> Any:
        out = save(global_step, logs, *args, **kwargs)
        logger.log_train(global_step, logs)
        return out

    trainer.save_logs_and_checkpoints = save_logs_and_checkpoints
    maker = getattr(trainer, "experience_maker", None)
    if maker is not None:
        make = maker.make_experience_batch

        def make_experience_batch(*args: Any, **kwargs: Any) -> Any:
            experiences = make(*args, **kwargs)
            logger.record_experiences(experiences)
            return experiences

        maker.make_experience_batch = make_experience_batch
    return logger


class WorkerPath:
    """Per-rank sufficient statistics from ``ActorPPOTrainer.ppo_train``, replica leaders only.

    Every rank of an SP (ring-attention) or TP group holds the same micro-batch, so only the rank
    with ``sp_rank == tp_rank == 0`` reports and the world is the DP axis alone. Call
    :meth:`micro_batch` with per-token tensors before OpenRLHF's ``all_reduce``,
    :meth:`optimizer_step` after each optimizer step, :meth:`end_step` once per global step.
    """

    def __init__(
        self,
        run: str,
        *,
        dp_rank: int,
        dp_size: int,
        sp_rank: int = 0,
        tp_rank: int = 0,
        reporter: ReporterLike | None = None,
        role: str = "actor",
        samples_k: int = 8,
        **reporter_kw: Any,
    ) -> None:
        self.leader = sp_rank == 0 and tp_rank == 0
        self.samples_k = samples_k
        self.reporter: ReporterLike | None = None
        if self.leader:
            self.reporter = reporter or make_reporter(
                run, role, rank={"dp": dp_rank}, world={"dp": dp_size}, **reporter_kw
            )
        self._lr: float | None = None

    @classmethod
    def from_strategy(cls, strategy: Any, run: str, **kw: Any) -> WorkerPath:
        """Read the layout from a ``DeepspeedStrategy`` (its ``(dp, sp, tp)`` DeviceMesh)."""
        mesh = strategy.ds_device_mesh if hasattr(strategy, "ds_device_mesh") else strategy.mesh
        return cls(
            run,
            dp_rank=mesh["dp"].get_local_rank(), dp_size=mesh["dp"].size(),
            sp_rank=mesh["sp"].get_local_rank(), tp_rank=mesh["tp"].get_local_rank(), **kw,
        )

    def micro_batch(
        self,
        action_mask: Any,
        *,
        policy_loss: Any = None,
        entropy: Any = None,
        clipped: Any = None,
        approx_kl: Any = None,
        kl: Any = None,
        log_ratio: Any = None,
        sample_ids: Any = None,
        sample_payload: Any = None,
    ) -> None:
        """Per-token tensors of one micro-batch (shape of ``action_mask``), token-masked.

        ``log_ratio`` (``old_action_log_probs - rollout_log_probs``, per token) ranks the
        micro-batch's sequences by mismatch on the device (the worst ``samples_k`` of the step);
        ``sample_ids`` / ``sample_payload`` (a sequence or a function of the index) name them
        and give their text, asked only for the selected few."""
        rep = self.reporter
        if rep is None:
            return
        for name, values in ((catalog.LOSS, policy_loss), (catalog.ENTROPY, entropy),
                             (catalog.CLIP_RATIO, clipped), (catalog.APPROX_KL, approx_kl),
                             (catalog.KL, kl)):
            if values is not None:
                rep.record_tensor(name, values, action_mask, reduce="token_mean")
        if log_ratio is not None:
            record_mismatch_samples(rep, log_ratio, action_mask, k=self.samples_k,
                                    ids=sample_ids, payload=sample_payload)
        rep.end_micro_batch()  # reduce now (a few launches) and release the tensors

    def optimizer_step(self, index: int, *, grad_norm: float | None = None,
                       lr: float | None = None) -> None:
        """Every optimizer step's global grad norm (OpenRLHF logs only the last one)."""
        if self.reporter is None:
            return
        if grad_norm is not None:
            self.reporter.record(catalog.GRAD_NORM, value=float(grad_norm), minibatch=index,
                                 minibatch_reduce="mean")
        if lr is not None:
            self._lr = float(lr)

    def end_step(self, step: int) -> None:
        if self.reporter is None:
            return
        if self._lr is not None:
            self.reporter.record(catalog.LR, value=self._lr)
            self._lr = None
        self.reporter.end_step(int(step))

    def close(self) -> None:
        if self.reporter is not None:
            self.reporter.flush(10.0)
            self.reporter.close()
