"""verl: a tracking backend next to wandb/console in ``verl.utils.tracking.Tracking``.

verl's trainer calls ``logger.log(data=metrics, step=global_steps)`` once per step on every
backend in ``Tracking.logger``. Its actor metrics are means of micro-batch means and its loss
metrics sums over mini-batches x epochs (``verl/utils/metric/utils.py``), so they are relayed
under ``verl/<key>``; driver-side data metrics (``verl/trainer/ppo/metric_utils.py``) are exact
and go under canonical names.

The stop switch (``rlmon.service.contract.stop_decision``): check ``backend.reporter.should_stop()``
(``logger.logger["rlmon"]`` of the trainer's ``Tracking``) on the driver in ``RayPPOTrainer.fit``
right after ``logger.log(data=metrics, step=self.global_steps)``, and return the way verl ends
at its last step (save a checkpoint, then return); it reads the last acknowledgement and never
waits, and the driver's return ends the step loop for every worker.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlmon.actors.integrations._base import (
    ReporterLike,
    end_training,
    framework_version,
    make_reporter,
    plan_steps,
    relay,
    send_run_info,
)

__all__ = ["RlmonBackend", "install"]

FRAMEWORK = "verl"
BACKEND = "rlmon"


class RlmonBackend:
    """One verl tracking backend: ``log(data, step)`` and ``finish()``."""

    def __init__(self, run: str, *, reporter: ReporterLike | None = None, role: str = "driver",
                 config: Any = None, **reporter_kw: Any) -> None:
        self.reporter = reporter or make_reporter(run, role, **reporter_kw)
        self.run_info = send_run_info(
            self.reporter, framework=FRAMEWORK, framework_version=framework_version(FRAMEWORK),
            algorithm=_dig(config, "algorithm.adv_estimator"),
            loss_reduction=_dig(config, "actor_rollout_ref.actor.loss_agg_mode"),
        )
        # the planned steps, where the config sets them (verl computes its
        # total_training_steps from the data otherwise, and writes it back into the config)
        self._config = config
        plan_steps(self.reporter, _number(config, "trainer.total_training_steps"))

    def log(self, data: Mapping[str, Any], step: int) -> None:
        if getattr(self.reporter, "total_steps", 1) is None:  # written back by the trainer
            plan_steps(self.reporter, _number(self._config, "trainer.total_training_steps"))
        relay(self.reporter, FRAMEWORK, data)
        self.reporter.end_step(int(step))

    def finish(self) -> None:
        """verl's end of training (``Tracking.finish``, also run when the tracker is
        collected): the Reporter closes, saying the rank ended cleanly."""
        end_training(self.reporter)


def _number(config: Any, path: str) -> int | None:
    text = _dig(config, path)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _dig(config: Any, path: str) -> str | None:
    """A dotted field of verl's config (OmegaConf or plain dicts), as text; None if absent."""
    node = config
    for part in path.split("."):
        if node is None:
            return None
        node = node.get(part) if isinstance(node, Mapping) else getattr(node, part, None)
    return None if node is None else str(node)


def install(run: str, tracking_cls: Any = None, **kw: Any) -> None:
    """Let ``trainer.logger=[..., "rlmon"]`` add :class:`RlmonBackend` to verl's ``Tracking``.

    Patches the class (``verl.utils.tracking.Tracking`` unless given), so it must run in the
    process that builds the tracker (the ``TaskRunner``; e.g. a Ray ``worker_process_setup_hook``).
    """
    if tracking_cls is None:
        from verl.utils import tracking

        tracking_cls = tracking.Tracking
    if getattr(tracking_cls, "_rlmon_installed", False):
        return
    supported = getattr(tracking_cls, "supported_backend", None)
    if isinstance(supported, list) and BACKEND not in supported:
        supported.append(BACKEND)
    init = tracking_cls.__init__

    def __init__(self: Any, project_name: Any, experiment_name: Any,
                 default_backend: Any = "console", *args: Any, **kwargs: Any) -> None:
        backends = [default_backend] if isinstance(default_backend, str) else list(default_backend)
        wanted = BACKEND in backends
        rest = [b for b in backends if b != BACKEND]
        init(self, project_name, experiment_name, rest, *args, **kwargs)
        if wanted:
            config = kwargs.get("config", args[0] if args else None)
            self.logger[BACKEND] = RlmonBackend(run or str(experiment_name), config=config, **kw)

    tracking_cls.__init__ = __init__
    tracking_cls._rlmon_installed = True
