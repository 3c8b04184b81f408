"""DeepSpeed: an engine probe and the loss normalization against non-DeepSpeed runs (seed 000).

The probe reads what ``deepspeed.runtime.engine.DeepSpeedEngine`` already tracks: the fp16 loss
scale, skipped (overflowed) optimizer steps, the global grad norm, gradient accumulation steps and
the ZeRO stage. ``engine.backward`` divides the loss by gradient_accumulation_steps, so the loss
DeepSpeed back-propagates (and logs) is 1/gas of a plain run's. :meth:`EngineProbe.record` takes
either loss by name: ``loss=`` the forward loss as the user computed it (``loss.item()`` before
``engine.backward``), or ``scaled_loss=`` DeepSpeed's 1/gas view; it reports the comparable loss
as the canonical ``actor/loss`` and DeepSpeed's scaled view as ``deepspeed/loss_scaled``. ZeRO
stage, gas and the DeepSpeed version go to the service as run metadata (``set_run_info``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlmon.actors.integrations._base import (
    ReporterLike,
    end_training,
    framework_version,
    make_reporter,
    plan_steps,
    send_run_info,
)
from rlmon.service.alerting.sanity import LossNormalization
from rlmon.service.metrics import catalog, keymaps

__all__ = ["EngineProbe", "EngineSnapshot", "probe"]

FRAMEWORK = "deepspeed"
_CLOSERS = "_rlmon_close_on_destroy"  # the engine's probes, closed by its destroy()
LOSS_SCALED = keymaps.relay_name(FRAMEWORK, "loss_scaled")  # what engine.backward propagates


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
    """Records the probe's values each step: ``EngineProbe(engine, run="sft-1")``.

    ``algorithm`` (e.g. ``"sft"``, ``"dpo"``) and ``dpo`` go into the run metadata with the
    engine's ZeRO stage, gradient accumulation steps, DP size and DeepSpeed version.
    """

    def __init__(self, engine: Any, run: str | None = None, *,
                 reporter: ReporterLike | None = None, role: str = "actor",
                 algorithm: str | None = None, dpo: bool | None = None,
                 total_steps: int | None = None, **reporter_kw: Any) -> None:
        """``total_steps``: the steps the training loop plans (a final save after the last is
        then not a stall). ``engine.destroy()`` (DeepSpeed's end of an engine) closes the
        Reporter; :meth:`close` does too."""
        self.engine = engine
        if reporter is None:
            if run is None:
                raise ValueError("give run= or reporter=")
            reporter = make_reporter(run, role, **reporter_kw)
        self.reporter: ReporterLike = reporter
        snap = probe(engine)
        version = framework_version(FRAMEWORK)
        self.normalization = LossNormalization(
            deepspeed=True, gradient_accumulation_steps=snap.gradient_accumulation_steps,
            scaled_by_gas=True, zero_stage=snap.zero_stage, deepspeed_version=version,
        )
        plan_steps(reporter, total_steps)
        # every probe of the engine closes on its destroy (one wrapper, however many probes)
        closers: list[Callable[[], None]] | None = vars(engine).get(_CLOSERS)
        destroy = getattr(engine, "destroy", None)
        if closers is None and callable(destroy) and "destroy" not in vars(engine):
            closers = []

            def destroy_then_close(*args: Any, **kwargs: Any) -> Any:
                try:
                    return destroy(*args, **kwargs)
                finally:
                    for close in list(closers):
                        close()

            engine.destroy = destroy_then_close
            setattr(engine, _CLOSERS, closers)
        if closers is not None:
            closers.append(self.close)
        dp = getattr(engine, "dp_world_size", None)
        self.run_info = send_run_info(
            reporter, framework=FRAMEWORK, framework_version=version, deepspeed_version=version,
            algorithm=algorithm, dpo=dpo, zero_stage=snap.zero_stage,
            grad_accumulation=snap.gradient_accumulation_steps,
            dp=int(dp) if isinstance(dp, int) else None,
        )

    def record(self, step: int, loss: float | None = None, *, scaled_loss: float | None = None,
               end_step: bool = True) -> EngineSnapshot:
        """Record the probe and the loss: ``loss`` is the forward loss as computed (the value
        handed to ``engine.backward``), ``scaled_loss`` DeepSpeed's 1/gas view of it; give one.
        Both become ``actor/loss`` in the comparable (non-DeepSpeed) scale and
        ``deepspeed/loss_scaled`` in DeepSpeed's. Called once per micro-batch with
        ``end_step=False``, the losses pool into the step's mean."""
        if loss is not None and scaled_loss is not None:
            raise ValueError("give loss= (the forward loss) or scaled_loss= (loss / gas), not both")
        snap = probe(self.engine)
        rep = self.reporter
        if snap.loss_scale is not None:
            rep.record(catalog.LOSS_SCALE, value=snap.loss_scale)
        rep.record(catalog.SKIPPED_STEPS, value=float(snap.skipped_steps))
        if snap.global_grad_norm is not None:
            rep.record(catalog.GRAD_NORM, value=snap.global_grad_norm)
        factor = self.normalization.factor
        if scaled_loss is not None:
            loss = float(scaled_loss) * factor
        if loss is not None:
            rep.record(catalog.LOSS, sum=float(loss), count=1.0)
            rep.record(LOSS_SCALED, sum=float(loss) / factor, count=1.0)
        if end_step:
            rep.end_step(int(step))
        return snap

    def close(self) -> None:
        """The end of training: the Reporter closes (the rank ends cleanly). Idempotent."""
        end_training(self.reporter)
