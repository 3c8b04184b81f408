"""SkyRL: a tracker wrapper through ``BasePPOExp.get_tracker`` and a worker path with sufficient stats.

SkyRL reduces worker metrics with ``reduce_metrics`` / ``all_reduce_metrics``
(``skyrl/backends/skyrl_train/workers/worker_utils.py``): ``*_loss`` keys are summed over
micro-batches and DP ranks (advantages were pre-divided on the driver by the loss-reduction
normalizer), then averaged over mini-batches by the trainer; every other key is a mean of
micro-batch means. :class:`WorkerPath` reports (sum, count) instead:

- ``actor/loss`` from the raw per-token loss, normalized exactly as the ``loss_reduction`` mode
  does (token_mean, token_mean_legacy, sequence_mean, seq_mean_token_sum_norm), pooled within a
  mini-batch over micro-batches and DP ranks, then a plain mean over mini-batches;
- SkyRL's own per-rank ``policy_loss`` partial sums, as ``{"sum": x, "minibatch_reduce": "mean"}``;
- token means (entropy, KL, clip ratio, IS ratio) pooled over the whole step.

CP/SP replicas hold the same samples, so every partial is marked ``replicated: ["cp"]``: one copy
counts, and copies that disagree raise ReplicaMismatch (the SkyRL #1420 double count).

The stop switch (``rlmon.service.contract.stop_decision``): check ``tracker.reporter.should_stop()`` (the
:class:`RlmonTracking` that ``get_tracker`` returns) in the trainer's step loop on the driver,
after ``self.tracker.log(...)`` of the step (``RayPPOTrainer.train``), and leave the loop after
the checkpoint; it reads the last acknowledgement and never waits. The workers' ``WorkerPath``
need not check: the driver ends the step loop for all of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rlmon.actors.integrations._base import (
    ReporterLike,
    as_float64,
    end_training,
    framework_version,
    make_reporter,
    plan_steps,
    relay,
    send_run_info,
)
from rlmon.service.metrics import catalog, keymaps

__all__ = ["LOSS_REDUCTIONS", "RlmonTracking", "WorkerPath", "loss_partial", "loss_units",
           "wrap_tracker"]

FRAMEWORK = "skyrl"
LOSS_REDUCTIONS = ("token_mean", "token_mean_legacy", "sequence_mean", "seq_mean_token_sum_norm")
POLICY_LOSS = keymaps.relay_name(FRAMEWORK, "policy/policy_loss")
CP = ["cp"]


def loss_partial(
    per_token_loss: Any,
    loss_mask: Any,
    loss_reduction: str,
    *,
    micro_batch_size: int | None = None,
    max_seq_len: int | None = None,
) -> tuple[float, float]:
    """(sum, count) of one micro-batch such that Σsum / Σcount over a mini-batch is SkyRL's loss.

    Mirrors ``apply_loss_reduction_to_advantages_minibatch`` (``utils/ppo_utils.py``):
    token_mean divides by the mini-batch's tokens; sequence_mean averages per-sequence token
    means; seq_mean_token_sum_norm divides token sums by ``max_seq_len`` and averages over
    sequences; token_mean_legacy averages token means of consecutive ``micro_batch_size`` chunks.
    """
    loss, mask = np.atleast_2d(as_float64(per_token_loss)), np.atleast_2d(as_float64(loss_mask))
    masked = loss * mask
    if loss_reduction == "token_mean":
        return float(masked.sum()), float(mask.sum())
    if loss_reduction == "sequence_mean":
        per_seq = masked.sum(axis=1) / np.maximum(mask.sum(axis=1), 1.0)
        return float(per_seq.sum()), float(len(per_seq))
    if loss_reduction == "seq_mean_token_sum_norm":
        if not max_seq_len:
            raise ValueError("seq_mean_token_sum_norm needs max_seq_len")
        return float(masked.sum() / max_seq_len), float(loss.shape[0])
    if loss_reduction == "token_mean_legacy":
        if not micro_batch_size:
            raise ValueError("token_mean_legacy needs micro_batch_size")
        total, chunks = 0.0, 0
        for start in range(0, loss.shape[0], micro_batch_size):
            chunk = slice(start, start + micro_batch_size)
            total += float(masked[chunk].sum() / max(mask[chunk].sum(), 1.0))
            chunks += 1
        return total, float(chunks)
    raise ValueError(f"loss_reduction must be one of {LOSS_REDUCTIONS}, got {loss_reduction!r}")


def loss_units(
    per_token_loss: Any,
    loss_mask: Any,
    loss_reduction: str,
    *,
    micro_batch_size: int | None = None,
    max_seq_len: int | None = None,
) -> tuple[Any, Any]:
    """:func:`loss_partial` left on the device: ``(values, mask)`` whose token mean pooled over
    a mini-batch is SkyRL's loss, for ``Reporter.record_tensor`` (no host sync).

    token_mean keeps the tokens and their mask; the other reductions give one float64 number
    per unit (sequence, or chunk for token_mean_legacy) and no mask, so the count is the units.
    """
    import torch

    f64 = torch.float64
    loss = torch.atleast_2d(per_token_loss.detach())
    mask = torch.atleast_2d(torch.as_tensor(loss_mask, device=loss.device)).bool()
    if loss_reduction == "token_mean":
        return loss, mask
    zeroed = torch.where(mask, loss, 0)
    if loss_reduction == "sequence_mean":
        per_seq = zeroed.sum(-1, dtype=f64) / mask.sum(-1, dtype=f64).clamp(min=1.0)
        return per_seq, None
    if loss_reduction == "seq_mean_token_sum_norm":
        if not max_seq_len:
            raise ValueError("seq_mean_token_sum_norm needs max_seq_len")
        return zeroed.sum(-1, dtype=f64) / max_seq_len, None
    if loss_reduction == "token_mean_legacy":
        if not micro_batch_size:
            raise ValueError("token_mean_legacy needs micro_batch_size")
        chunks = [zeroed[i:i + micro_batch_size].sum(dtype=f64)
                  / mask[i:i + micro_batch_size].sum(dtype=f64).clamp(min=1.0)
                  for i in range(0, loss.shape[0], micro_batch_size)]
        return torch.stack(chunks), None
    raise ValueError(f"loss_reduction must be one of {LOSS_REDUCTIONS}, got {loss_reduction!r}")


class WorkerPath:
    """Sufficient statistics from a SkyRL policy worker's ``forward_backward``.

    ``rank`` / ``world`` span DP and CP (Ulysses SP counts as CP); every rank reports and
    replicas are deduplicated by the aggregator.
    """

    def __init__(
        self,
        run: str,
        *,
        loss_reduction: str = "token_mean",
        dp_rank: int = 0,
        dp_size: int = 1,
        cp_rank: int = 0,
        cp_size: int = 1,
        micro_batch_size: int | None = None,
        max_seq_len: int | None = None,
        reporter: ReporterLike | None = None,
        role: str = "actor",
        samples_k: int = 8,
        **reporter_kw: Any,
    ) -> None:
        self.samples_k, self.cp_size = samples_k, cp_size
        if loss_reduction not in LOSS_REDUCTIONS:
            raise ValueError(f"loss_reduction must be one of {LOSS_REDUCTIONS}")
        self.loss_reduction = loss_reduction
        self.micro_batch_size, self.max_seq_len = micro_batch_size, max_seq_len
        self.reporter = reporter or make_reporter(
            run, role, rank={"dp": dp_rank, "cp": cp_rank}, world={"dp": dp_size, "cp": cp_size},
            **reporter_kw,
        )

    def micro_batch(
        self,
        loss_mask: Any,
        *,
        minibatch: int,
        per_token_loss: Any = None,
        entropy: Any = None,
        kl: Any = None,
        clipped: Any = None,
        is_ratio: Any = None,
        sample_ids: Any = None,
        sample_payload: Any = None,
    ) -> None:
        """Per-token tensors of one micro-batch of mini-batch ``minibatch``.

        ``is_ratio`` also ranks the sequences on the device: the smallest token IS ratio per
        sequence (``actor/is_ratio_lowest``) and, without CP (a sequence whole on the rank),
        the largest mean abs(log ratio) (``actor/logp_diff_worst``); ``sample_ids`` (e.g. the
        batch's ``uids``) and ``sample_payload`` (a sequence or a function of the index) are
        asked only for the selected few."""
        rep = self.reporter
        if per_token_loss is not None and type(per_token_loss).__module__.startswith("torch"):
            # on the device: no host sync per micro-batch
            values, mask = loss_units(per_token_loss, loss_mask, self.loss_reduction,
                                      micro_batch_size=self.micro_batch_size,
                                      max_seq_len=self.max_seq_len)
            rep.record_tensor(catalog.LOSS, values, mask, reduce="token_mean",
                              minibatch=minibatch, minibatch_reduce="mean", replicated=CP)
        elif per_token_loss is not None:
            s, c = loss_partial(per_token_loss, loss_mask, self.loss_reduction,
                                micro_batch_size=self.micro_batch_size,
                                max_seq_len=self.max_seq_len)
            rep.record(catalog.LOSS, sum=s, count=c, minibatch=minibatch,
                       minibatch_reduce="mean", replicated=CP)
        for name, values in ((catalog.ENTROPY, entropy), (catalog.KL, kl),
                             (catalog.CLIP_RATIO, clipped), (catalog.IS_RATIO, is_ratio)):
            if values is not None:
                rep.record_tensor(name, values, loss_mask, reduce="token_mean", replicated=CP)
        if is_ratio is not None:
            # a sequence split over CP ranks: its shards share the default id, so the merge
            # keeps the smallest shard minimum, the sequence's; a mean would need every shard
            rep.record_sample_tensor(catalog.IS_RATIO_LOWEST, is_ratio, loss_mask, score="min",
                                     k=self.samples_k, ids=sample_ids, payload=sample_payload)
            if self.cp_size == 1:
                log_ratio = is_ratio.log() if hasattr(is_ratio, "log") else np.log(
                    np.asarray(is_ratio, dtype=np.float64))
                rep.record_sample_tensor(catalog.LOGP_DIFF_WORST, abs(log_ratio), loss_mask,
                                         score="mean", k=self.samples_k, ids=sample_ids,
                                         payload=sample_payload)
        rep.end_micro_batch()  # reduce now (a few launches) and release the tensors

    def policy_loss(self, value: float, *, minibatch: int) -> None:
        """SkyRL's own per-micro-batch ``policy_loss`` (a partial sum with pre-scaled advantages)."""
        self.reporter.record(POLICY_LOSS, sum=float(value), minibatch=minibatch,
                             minibatch_reduce="mean", replicated=CP)

    def optimizer_step(self, index: int, *, grad_norm: float) -> None:
        self.reporter.record(catalog.GRAD_NORM, value=float(grad_norm), minibatch=index,
                             minibatch_reduce="mean")

    def end_step(self, step: int) -> None:
        self.reporter.end_step(int(step))

    def close(self) -> None:
        self.reporter.flush(10.0)
        self.reporter.close()


class RlmonTracking:
    """Wraps SkyRL's ``Tracking`` (``skyrl/train/utils/tracking.py``) and relays what it logs.

    A step ends on ``commit=True`` (the fully-async trainer logs ``commit=False`` first) or when a
    later step arrives. Everything else is delegated to the wrapped tracker.
    """

    def __init__(self, inner: Any, run: str, *, reporter: ReporterLike | None = None,
                 role: str = "driver", total_steps: int | None = None,
                 **reporter_kw: Any) -> None:
        """``total_steps``: the trainer's ``total_training_steps`` where it is known when the
        tracker is made; else :meth:`set_total_steps` once the trainer computed it."""
        self.inner = inner
        self.reporter = reporter or make_reporter(run, role, **reporter_kw)
        plan_steps(self.reporter, total_steps)
        # the service names SkyRL's keys in what to change (rlmon.service.metrics.remedies)
        self.run_info = send_run_info(self.reporter, framework=FRAMEWORK,
                                      framework_version=framework_version(FRAMEWORK))
        self._pending: int | None = None

    def log(self, data: Mapping[str, Any], step: int, commit: bool = False) -> None:
        if self.inner is not None:
            self.inner.log(data, step=step, commit=commit)
        if self._pending is not None and step != self._pending:
            self.reporter.end_step(self._pending)
            self._pending = None
        relay(self.reporter, FRAMEWORK, data)
        self._pending = int(step)
        if commit:
            self.reporter.end_step(self._pending)
            self._pending = None

    def set_total_steps(self, total_steps: int) -> None:
        """The run's planned steps (SkyRL's ``trainer.total_training_steps``)."""
        plan_steps(self.reporter, total_steps)

    def finish(self) -> None:
        """SkyRL's end of training (the trainer's ``tracker.finish()``): the last step ends and
        the Reporter closes, saying the rank ended cleanly."""
        if self._pending is not None:
            self.reporter.end_step(self._pending)
            self._pending = None
        end_training(self.reporter)
        finish = getattr(self.inner, "finish", None)
        if callable(finish):
            finish()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def wrap_tracker(tracker: Any, run: str, **kw: Any) -> RlmonTracking:
    """``class Exp(BasePPOExp): def get_tracker(self): return wrap_tracker(super().get_tracker(), run)``."""
    return RlmonTracking(tracker, run, **kw)
