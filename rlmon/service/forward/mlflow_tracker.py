"""Forwarding to MLflow with its own client (``MlflowClient``; the ``forward`` extra).

One MLflow run per tracker run in the configured experiment, found again by its
``rlmon.run_id`` tag (a restarted service continues it). Values are metrics at the role's step
(MLflow keeps a metric's history by step), the settings are params (MLflow's params cannot
change: a later different value is the tag ``rlmon.setting.<name>``), an alert transition is the
tag ``rlmon.alert.<role>.<alert>`` (its latest state and summary line), and the end state is the
run's status (finished: FINISHED, failed: FAILED, preempted: KILLED) with the tag
``rlmon.end_state``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from rlmon.service.alerting.alert_types import AlertEvent
from rlmon.service.alerting.notify.render import summary_line, transition_label
from rlmon.service.config import MlflowForward
from rlmon.service.forward.tracker import EndState, ForwardedStep, TrackerRun

__all__ = ["MlflowTracker", "mlflow_key"]

_STATUS = {"finished": "FINISHED", "failed": "FAILED", "preempted": "KILLED"}
_BATCH = 1_000  # MLflow's limit of metrics per log_batch call


def mlflow_key(name: str) -> str:
    """A name MLflow accepts as a metric, param or tag key (letters, digits, ``_-./ :``)."""
    return re.sub(r"[^\w\-./ :]", "_", name)[:250]


class MlflowTracker:
    name = "mlflow"

    def __init__(self, config: MlflowForward) -> None:
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient

        self.config = config
        self._client = MlflowClient(tracking_uri=config.tracking_uri)
        self._metric, self._param = Metric, Param
        self._runs: dict[TrackerRun, str] = {}
        self._params: dict[TrackerRun, dict[str, str]] = {}

    def _experiment(self) -> str:
        client = self._client
        found = client.get_experiment_by_name(self.config.experiment)
        if found is not None:
            return str(found.experiment_id)
        return str(client.create_experiment(self.config.experiment))

    def _open(self, run: TrackerRun, settings: Mapping[str, str]) -> str:
        run_id = self._runs.get(run)
        if run_id is None:
            client = self._client
            experiment = self._experiment()
            found = client.search_runs([experiment], f"tags.`rlmon.run_id` = '{run.id}'",
                                       max_results=1)
            if found:
                run_id = str(found[0].info.run_id)
                if found[0].info.status != "RUNNING":
                    client.update_run(run_id, status="RUNNING")
                self._params[run] = dict(found[0].data.params)
            else:
                run_id = str(client.create_run(experiment, run_name=run.name, tags={
                    "rlmon.run": run.run, "rlmon.attempt": str(run.attempt),
                    "rlmon.run_id": run.id}).info.run_id)
                self._params[run] = {}
            self._runs[run] = run_id
        self._log_settings(run, run_id, settings)
        return run_id

    def _log_settings(self, run: TrackerRun, run_id: str, settings: Mapping[str, str]) -> None:
        logged = self._params[run]
        fresh = {mlflow_key(k): v[:6000] for k, v in settings.items()}
        new = {k: v for k, v in fresh.items() if k not in logged}
        changed = {k: v for k, v in fresh.items() if k in logged and logged[k] != v}
        if new:
            self._client.log_batch(run_id, params=[self._param(k, v) for k, v in new.items()])
            logged.update(new)
        for key, value in changed.items():
            self._client.set_tag(run_id, f"rlmon.setting.{key}", value)

    def log(self, run: TrackerRun, settings: Mapping[str, str],
            steps: Sequence[ForwardedStep]) -> None:
        run_id = self._open(run, settings)
        metrics: list[Any] = [
            self._metric(mlflow_key(key), value, int(step.time * 1000), step.step)
            for step in steps for key, value in step.values.items()]
        for start in range(0, len(metrics), _BATCH):
            self._client.log_batch(run_id, metrics=metrics[start:start + _BATCH])

    def alerts(self, run: TrackerRun, settings: Mapping[str, str],
               events: Sequence[AlertEvent]) -> None:
        run_id = self._open(run, settings)
        for event in events:
            state = transition_label(event.state, event.ended_with_run, event.handed_to)
            self._client.set_tag(run_id, mlflow_key(f"rlmon.alert.{event.role}.{event.alert}"),
                                 f"{state} at step {event.step}: {summary_line(event)}"[:5000])

    def settings(self, run: TrackerRun, settings: Mapping[str, str]) -> None:
        self._open(run, settings)

    def end(self, run: TrackerRun, state: EndState) -> None:
        run_id = self._open(run, {})
        self._client.set_tag(run_id, "rlmon.end_state", state)
        self._client.set_terminated(run_id, _STATUS[state])
        self.release(run)

    def release(self, run: TrackerRun) -> None:
        self._runs.pop(run, None)
        self._params.pop(run, None)
