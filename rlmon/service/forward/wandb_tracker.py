"""Forwarding to Weights & Biases with its own client (``wandb``).

One W&B run per tracker run (id :attr:`TrackerRun.id`, resumed if it exists). Each role's values
are plotted against that role's step (``rlmon_step/<role>``, W&B's ``define_metric``): roles
finalize steps at their own pace, and W&B's own ``_step`` must only grow. The run's settings are
its config; an alert transition is a W&B alert (critical: ERROR, warning: WARN, resolved: INFO);
the end state is the summary's ``rlmon_end_state`` and the run's exit (failed: exit code 1,
preempted: marked preempting first).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlmon.service.alerting.alert_types import AlertEvent
from rlmon.service.alerting.notify.render import summary_line
from rlmon.service.config import WandbForward
from rlmon.service.forward.tracker import EndState, ForwardedStep, TrackerRun, step_key

__all__ = ["WandbTracker"]


class WandbTracker:
    name = "wandb"

    def __init__(self, config: WandbForward) -> None:
        import wandb

        self._wandb = wandb
        self.config = config
        self._runs: dict[TrackerRun, Any] = {}
        self._roles: dict[TrackerRun, set[str]] = {}

    def _open(self, run: TrackerRun, settings: Mapping[str, str]) -> Any:
        handle = self._runs.get(run)
        if handle is not None:
            return handle
        wandb, cfg = self._wandb, self.config
        directory = None
        if cfg.dir is not None:
            Path(cfg.dir).mkdir(parents=True, exist_ok=True)
            directory = str(cfg.dir)
        handle = wandb.init(
            project=cfg.project, entity=cfg.entity, id=run.id, name=run.name, dir=directory,
            config=dict(settings), resume="allow", reinit="create_new", tags=_tags(settings),
            settings=wandb.Settings(mode=cfg.mode, silent=True, console="off",
                                    x_disable_stats=True))
        self._runs[run] = handle
        self._roles[run] = set()
        return handle

    def log(self, run: TrackerRun, settings: Mapping[str, str],
            steps: Sequence[ForwardedStep]) -> None:
        handle = self._open(run, settings)
        roles = self._roles[run]
        for step in steps:
            key = step_key(step.role)
            if step.role not in roles:
                handle.define_metric(key, hidden=True)
                handle.define_metric(f"{step.role}/*", step_metric=key)
                roles.add(step.role)
            handle.log({key: step.step, **step.values})

    def alerts(self, run: TrackerRun, settings: Mapping[str, str],
               events: Sequence[AlertEvent]) -> None:
        handle = self._open(run, settings)
        from wandb.sdk.wandb_alerts import AlertLevel

        for event in events:
            handle.alert(
                title=f"{event.alert} on {event.run}/{event.role}"[:64],
                text=summary_line(event),
                # a closing because the run ended with it firing keeps its severity's level
                level=(AlertLevel.INFO if event.state == "resolved" and not event.ended_with_run
                       else AlertLevel.ERROR if event.severity == "critical"
                       else AlertLevel.WARN),
                wait_duration=1)

    def settings(self, run: TrackerRun, settings: Mapping[str, str]) -> None:
        handle = self._open(run, settings)
        handle.config.update(dict(settings), allow_val_change=True)
        if tuple(handle.tags or ()) != tuple(_tags(settings)):
            handle.tags = tuple(_tags(settings))

    def end(self, run: TrackerRun, state: EndState) -> None:
        handle = self._open(run, {})
        handle.summary["rlmon_end_state"] = state
        if state == "preempted":
            handle.mark_preempting()
        handle.finish(exit_code=0 if state == "finished" else 1)
        self._runs.pop(run, None)
        self._roles.pop(run, None)

    def release(self, run: TrackerRun) -> None:
        handle = self._runs.pop(run, None)
        self._roles.pop(run, None)
        if handle is not None:
            handle.finish()


def _tags(settings: Mapping[str, str]) -> list[str]:
    """The W&B run's tags: rlmon's, and the run's own (``RunInfo.tags``, joined by commas)."""
    return ["rlmon", *(t for t in settings.get("tags", "").split(",") if t and t != "rlmon")]
