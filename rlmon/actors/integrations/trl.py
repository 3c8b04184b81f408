"""TRL: a ``transformers.TrainerCallback`` whose ``on_log`` relays GRPOTrainer / PPOTrainer keys.

TRL logs on the main process after averaging every collected list over the logging window
(``trl/trainer/grpo_trainer.py``). Keys that are global and exact per batch (rewards, lengths,
``kl``/``entropy``/``clip_ratio/region_mean`` since TRL PR #6380) go under canonical names;
mean-of-rank-means keys (``sampling/*``), window means of extrema (``clip_ratio/low_min``,
``clip_ratio/high_max``) and the trainer ``loss`` go under ``trl/<key>``. ``transformers`` is
imported only when the callback class is first used.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlmon.actors.integrations._base import (
    ReporterLike,
    framework_version,
    lazy_class,
    make_reporter,
    relay,
    send_run_info,
)

__all__ = ["callback"]  # and RlmonCallback, built lazily by __getattr__

FRAMEWORK = "trl"


class _Relay:
    """The framework-free part of the callback."""

    def __init__(self, run: str, *, reporter: ReporterLike | None = None,
                 role: str = "trainer", algorithm: str | None = None,
                 **reporter_kw: Any) -> None:
        self.run, self.role, self.algorithm = run, role, algorithm
        self.run_info: dict[str, Any] | None = None
        self._reporter = reporter
        self._kw = reporter_kw
        self.published: dict[str, str] = {}

    @property
    def reporter(self) -> ReporterLike:
        if self._reporter is None:
            self._reporter = make_reporter(self.run, self.role, **self._kw)
        return self._reporter

    def on_log(self, args: Any, state: Any, control: Any, logs: Mapping[str, Any] | None = None,
               **kwargs: Any) -> None:
        if not logs or not getattr(state, "is_world_process_zero", True):
            return
        if self.run_info is None:
            self.run_info = self._send_run_info(args)
        self.published.update(relay(self.reporter, FRAMEWORK, logs))
        self.reporter.end_step(int(state.global_step))

    def _send_run_info(self, args: Any) -> dict[str, Any]:
        """Run metadata from the trainer's args (GRPOConfig's ``loss_type`` is the reduction)."""

        def integer(name: str) -> int | None:
            try:  # TrainingArguments properties (world_size) need torch and a backend to answer
                value = getattr(args, name, None)
            except Exception:
                return None
            return int(value) if isinstance(value, int) and not isinstance(value, bool) else None

        loss_type = getattr(args, "loss_type", None)
        algorithm = self.algorithm
        return send_run_info(
            self.reporter, framework=FRAMEWORK, framework_version=framework_version(FRAMEWORK),
            algorithm=algorithm, dpo=(algorithm or "").lower() == "dpo" or None,
            loss_reduction=loss_type if isinstance(loss_type, str) else None,
            grad_accumulation=integer("gradient_accumulation_steps"), dp=integer("world_size"),
        )

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._reporter is not None:
            self._reporter.flush(10.0)


def _build() -> type:
    from transformers import TrainerCallback

    class RlmonCallback(_Relay, TrainerCallback):
        """``trainer.add_callback(RlmonCallback(run="grpo-7b"))``."""

    return RlmonCallback


__getattr__ = lazy_class(__name__, "RlmonCallback", _build)


def callback(run: str, **kw: Any) -> Any:
    """An :class:`RlmonCallback` instance (imports transformers)."""
    cls: Any = __getattr__("RlmonCallback")
    return cls(run, **kw)
