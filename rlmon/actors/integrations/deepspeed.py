"""DeepSpeed: an engine probe and the loss normalization against non-DeepSpeed runs (seed 000).

The probe reads what ``deepspeed.runtime.engine.DeepSpeedEngine`` already tracks: the fp16 loss
scale, skipped (overflowed) optimizer steps, the global grad norm, gradient accumulation steps and
the ZeRO stage. ``engine.backward`` divides the loss by gradient_accumulation_steps, so DeepSpeed
losses are 1/gas of a plain run's; :attr:`EngineProbe.normalization` keeps that as run metadata
and :meth:`EngineProbe.record` reports the comparable view next to the raw loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlmon.actors.integrations._base import ReporterLike, make_reporter
from rlmon.service import keymaps
from rlmon.service.sanity import LossNormalization

__all__ = ["EngineProbe", "EngineSnapshot", "probe"]

FRAMEWORK = "deepspeed"
LOSS_RAW = keymaps.relay_name(FRAMEWORK, "loss")
LOSS_COMPARABLE = keymaps.relay_name(FRAMEWORK, "loss_comparable")
GAS = keymaps.relay_name(FRAMEWORK, "gradient_accumulation_steps")
ZERO = keymaps.relay_name(FRAMEWORK, "zero_stage")


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    loss_scale: float | None
    skipped_steps: int
    global_grad_norm: float | None
    gradient_accumulation_steps: int
    zero_stage: int
    global_steps: int


def _loss_scale(engine: Any) -> float | None:
    if not engine.fp16_enabled():
        return None
    opt = engine.optimizer
    for holder in (opt, getattr(opt, "loss_scaler", None)):
        scale = getattr(holder, "cur_scale", None)
        if scale is not None:
            return float(scale)
    scale = getattr(opt, "loss_scale", None)
    return float(scale) if isinstance(scale, int | float) else None


def probe(engine: Any) -> EngineSnapshot:
    """Read the engine's counters (no collective, no device sync beyond DeepSpeed's own norm)."""
    norm = engine.get_global_grad_norm()
    return EngineSnapshot(
        loss_scale=_loss_scale(engine),
        skipped_steps=int(engine.skipped_steps),
        global_grad_norm=None if norm is None else float(norm),
        gradient_accumulation_steps=int(engine.gradient_accumulation_steps()),
        zero_stage=int(engine.zero_optimization_stage()),
        global_steps=int(engine.global_steps),
    )


class EngineProbe:
    """Records the probe's values each step: ``EngineProbe(engine, run="sft-1")``."""

    def __init__(self, engine: Any, run: str | None = None, *,
                 reporter: ReporterLike | None = None, role: str = "actor",
                 **reporter_kw: Any) -> None:
        import deepspeed

        self.engine = engine
        if reporter is None:
            if run is None:
                raise ValueError("give run= or reporter=")
            reporter = make_reporter(run, role, **reporter_kw)
        self.reporter: ReporterLike = reporter
        snap = probe(engine)
        self.normalization = LossNormalization(
            deepspeed=True, gradient_accumulation_steps=snap.gradient_accumulation_steps,
            scaled_by_gas=True, zero_stage=snap.zero_stage,
            deepspeed_version=str(deepspeed.__version__),
        )

    def record(self, step: int, loss: float | None = None, *,
               end_step: bool = True) -> EngineSnapshot:
        """Record the probe (and, given DeepSpeed's scaled loss, its comparable view)."""
        snap = probe(self.engine)
        rep = self.reporter
        if snap.loss_scale is not None:
            rep.record(keymaps.LOSS_SCALE, value=snap.loss_scale)
        rep.record(keymaps.SKIPPED_STEPS, value=float(snap.skipped_steps))
        if snap.global_grad_norm is not None:
            rep.record(keymaps.GRAD_NORM, value=snap.global_grad_norm)
        rep.record(GAS, value=float(snap.gradient_accumulation_steps))
        rep.record(ZERO, value=float(snap.zero_stage))
        if loss is not None:
            rep.record(LOSS_RAW, sum=float(loss), count=1.0)
            rep.record(LOSS_COMPARABLE, sum=self.normalization.comparable(float(loss)), count=1.0)
        if end_step:
            rep.end_step(int(step))
        return snap
