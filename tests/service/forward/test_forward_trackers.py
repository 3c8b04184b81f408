"""Forwarding to trackers with their real clients: a service fed the example run forwards every
step, its settings, its alerts and its end to W&B (offline run files, read back with W&B's own
protobuf records), MLflow (a file store, read back with MLflow's client) and TensorBoard (event
files, read back with TensorBoard's EventAccumulator); each value equals what /api/curves serves.
"""

from __future__ import annotations

import json
import math
import time
import urllib.parse
import urllib.request
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from rlmon.service.contract.run_info import RunInfo
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.forward.sink import ForwardSink
from rlmon.service.forward.tracker import TrackerRun, metric_key, step_key
from rlmon.service.liveness.run_state import LivenessView, RunState
from rlmon.service.service_core import ServiceCore
from tests.support.web_support import example_records, fed_service

pytest.importorskip("mlflow")
pytestmark = pytest.mark.slow

RUN = "grpo-demo-0"
ROLES = ("actor", "reward", "rollout")


def _curves(core: ServiceCore, role: str, metrics: list[str]) -> dict[str, dict[int, float]]:
    """/api/curves for ``metrics`` of a role, every step (no downsampling): metric -> step ->
    value (finite values; the page serves null for the others)."""
    out: dict[str, dict[int, float]] = {}
    for start in range(0, len(metrics), 8):
        query = urllib.parse.urlencode({"run": RUN, "role": role, "points": 100_000,
                                        "metrics": "\n".join(metrics[start:start + 8])})
        with urllib.request.urlopen(f"http://127.0.0.1:{core.port}/api/curves?{query}",
                                    timeout=30) as resp:
            body = json.loads(resp.read())
        for panel in body["panels"]:
            for name, ys in zip(panel["metrics"], panel["y"], strict=True):
                out[name] = {x: y for x, y in zip(panel["x"], ys, strict=True) if y is not None}
    return out


@pytest.fixture(scope="module")
def forwarded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The example run through a service that forwards to all three trackers, ended (the
    rollout role preempted, the others finished: the run's end is "preempted"). The actor's
    entropy collapses in its last three steps (30-32): EntropySliding fires and is handed over
    to EntropyCollapse, which is still firing when the actor finishes."""
    mp = pytest.MonkeyPatch()
    mp.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps its file store opt-in
    mp.setenv("WANDB_SILENT", "true")
    root = tmp_path_factory.mktemp("forward")
    records: list[StepRecord] = example_records()
    last = next(r for r in records if r.role == "actor" and r.step == 29)
    records += [replace(last, step=step, metrics={**last.metrics, "actor/entropy": 0.001})
                for step in (30, 31, 32)]
    forward = {
        "wandb": {"enabled": True, "mode": "offline", "project": "rlmon-test",
                  "dir": str(root / "wandb")},
        "mlflow": {"enabled": True, "tracking_uri": (root / "mlruns").as_uri(),
                   "experiment": "rlmon-test"},
        "tensorboard": {"enabled": True, "log_dir": str(root / "tb")},
        "batch_steps": 7,
    }
    core = fed_service(root / "state", [], forward=forward)
    try:
        core.spine.sinks[ForwardSink].start()
        core.set_run_info(RUN, RunInfo(framework="openrlhf", algorithm="grpo", dp=2, cp=2,
                                       tags=("baseline", "7b")))
        core.publish(records)
        now = time.time()
        ends = {"actor": RunState.FINISHED, "reward": RunState.FINISHED,
                "rollout": RunState.PREEMPTED}
        core.liveness([LivenessView(RUN, role, state, now, now, 32 if role == "actor" else 29,
                                    now, now, 1.0, 60.0, 4) for role, state in ends.items()])
        assert core.spine.sinks[ForwardSink].flush(120.0), core.spine.sinks[ForwardSink].stats()
        metrics: dict[str, list[str]] = defaultdict(list)
        for record in records:
            for name in record.metrics:
                if name not in metrics[record.role]:
                    metrics[record.role].append(name)
        curves = {role: _curves(core, role, metrics[role]) for role in ROLES}
        alerts = core.history.alerts(RUN, cost=True)
        stats = core.spine.sinks[ForwardSink].stats()
    finally:
        core.close(30.0)
        mp.undo()
    return {"root": root, "curves": curves, "alerts": alerts, "stats": stats,
           "records": records}


def _expected(forwarded: dict[str, Any]) -> dict[tuple[str, int], float]:
    """(tracker key, step) -> value, from /api/curves."""
    out = {}
    for role, by_metric in forwarded["curves"].items():
        for metric, by_step in by_metric.items():
            for step, value in by_step.items():
                out[(metric_key(role, metric), step)] = value
    assert len(out) > 500
    return out


def test_every_tracker_took_every_step_nothing_dropped(forwarded: dict[str, Any]) -> None:
    steps = len(forwarded["records"])
    for s in forwarded["stats"]:
        assert (s.tracker, s.steps_sent, s.steps_dropped, s.failures) == (s.tracker, steps, 0, 0)


def _wandb_records(root: Path) -> list[Any]:
    from wandb.proto import wandb_internal_pb2

    from rlmon.service.diagnose.readers.wandb import _payloads, run_files

    runs = list((root / "wandb" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1  # one W&B run for the one rlmon run
    out = []
    for file in run_files(runs[0]):
        with file.open("rb") as handle:
            for payload in _payloads(handle, str(file), []):
                record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]
                record.ParseFromString(payload)
                out.append(record)
    return out


def test_wandb_offline_run_holds_the_exact_values_settings_alerts_and_end(
        forwarded: dict[str, Any]) -> None:
    records = _wandb_records(forwarded["root"])
    got: dict[tuple[str, int], float] = {}
    config: dict[str, Any] = {}
    alerts, summary, exits, preempting = [], {}, [], 0
    tags: list[str] = []
    for record in records:
        kind = record.WhichOneof("record_type")
        if kind == "run":
            assert record.run.run_id == TrackerRun(RUN).id and record.run.display_name == RUN
            tags = list(record.run.tags)
            config.update({u.key: json.loads(u.value_json) for u in record.run.config.update})
        elif kind == "config":
            config.update({u.key: json.loads(u.value_json) for u in record.config.update})
        elif kind == "history":
            items = {"/".join(i.nested_key) or i.key: json.loads(i.value_json)
                     for i in record.history.item}
            role = next(r for r in ROLES if step_key(r) in items)
            for key, value in items.items():
                if key.startswith(role + "/"):
                    got[(key, items[step_key(role)])] = value
        elif kind == "alert":
            alerts.append((record.alert.title, record.alert.level, record.alert.text))
        elif kind == "summary":
            summary.update({u.key or "/".join(u.nested_key): json.loads(u.value_json)
                            for u in record.summary.update})
        elif kind == "exit":
            exits.append(record.exit.exit_code)
        elif kind == "preempting":
            preempting += 1
    expected = _expected(forwarded)
    assert {k: v for k, v in got.items() if k in expected} == expected
    assert all(not isinstance(v, float) or not math.isfinite(v) or k in expected
               for k, v in got.items())
    assert config["framework"] == "openrlhf" and config["dp"] == "2"
    assert tags == ["rlmon", "baseline", "7b"]  # the run's own tags as W&B's
    transitions = forwarded["alerts"]
    assert len(alerts) == len(transitions) > 0
    assert {t for t, _, _ in alerts} == {f"{a['alert']} on {RUN}/{a['role']}"
                                         for a in transitions}
    assert {level for _, level, _ in alerts} <= {"ERROR", "WARN", "INFO"}
    # an alert closed because its run ended, still firing, keeps its severity's level
    ended = [level for _, level, text in alerts if ", still firing when the run ended]" in text]
    assert ended and "INFO" not in ended
    assert summary["rlmon_end_state"] == "preempted" and preempting == 1 and exits == [1]


def test_mlflow_run_holds_the_exact_values_settings_alert_tags_and_end(
        forwarded: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=(forwarded["root"] / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("rlmon-test")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1
    run = runs[0]
    assert run.info.run_name == RUN and run.info.status == "KILLED"
    assert run.data.tags["rlmon.end_state"] == "preempted"
    assert run.data.params["framework"] == "openrlhf" and run.data.params["algorithm"] == "grpo"
    expected = _expected(forwarded)
    got = {}
    for key in {k for k, _ in expected}:
        for m in client.get_metric_history(run.info.run_id, key):
            got[(key, m.step)] = m.value
    assert got == expected
    alert_tags = {k: v for k, v in run.data.tags.items() if k.startswith("rlmon.alert.")}
    assert set(alert_tags) == {f"rlmon.alert.{a['role']}.{a['alert']}"
                               for a in forwarded["alerts"]}
    # each alert's tag is its last transition; the finished roles' alerts ended with the run,
    # still firing, and an early warning handed over to its level rule: never "resolved"
    last = {f"rlmon.alert.{a['role']}.{a['alert']}": (
        "firing when the run ended" if a["ended_with_run"] else
        f"handed over to {a['handed_to']}" if a["handed_to"] else a["state"], a["step"])
        for a in forwarded["alerts"]}
    assert {k: v.split(": ")[0] for k, v in alert_tags.items()} == {
        k: f"{state} at step {step}" for k, (state, step) in last.items()}
    assert any(state == "firing when the run ended" for state, _ in last.values())
    assert alert_tags["rlmon.alert.actor.EntropySliding"].startswith(
        "handed over to EntropyCollapse at step 32: [HANDED OVER to EntropyCollapse]")
    assert alert_tags["rlmon.alert.actor.EntropyCollapse"].startswith(
        "firing when the run ended at step 32")


def test_tensorboard_event_files_hold_the_exact_values_settings_alerts_and_end(
        forwarded: dict[str, Any]) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    runs = list((forwarded["root"] / "tb").iterdir())
    assert [p.name for p in runs] == [TrackerRun(RUN).id]
    acc = EventAccumulator(str(runs[0]), size_guidance={"tensors": 0})
    acc.Reload()
    tags = acc.Tags()["tensors"]
    got = {}
    texts: dict[str, list[str]] = defaultdict(list)
    for tag in tags:
        for event in acc.Tensors(tag):
            value = tensor_util.make_ndarray(event.tensor_proto)
            if tag.startswith("rlmon_"):
                texts[tag].append(value.item().decode())
            else:
                got[(tag, event.step)] = float(value.item())
    expected = _expected(forwarded)
    assert {k: v for k, v in got.items() if k in expected} == expected
    assert texts["rlmon_end_state"] == ["preempted"]
    assert "| framework | openrlhf |" in texts["rlmon_settings"][-1]
    alerts = [text for role in ROLES for text in texts[f"rlmon_alerts/{role}"]]
    assert len(alerts) == len(forwarded["alerts"])
    assert sum(", still firing when the run ended]" in text for text in alerts) == sum(
        bool(a["ended_with_run"]) for a in forwarded["alerts"]) > 0


def test_a_restarted_service_continues_the_same_mlflow_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow.tracking import MlflowClient

    from rlmon.service.config import MlflowForward
    from rlmon.service.forward.mlflow_tracker import MlflowTracker
    from rlmon.service.forward.tracker import ForwardedStep

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    config = MlflowForward(enabled=True, tracking_uri=(tmp_path / "mlruns").as_uri(),
                           experiment="restart")
    run = TrackerRun("run.with:odd-name", 1)
    first = MlflowTracker(config)
    first.log(run, {"dp": "2"}, [ForwardedStep("actor", 1, 1_700_000_000.0, {"actor/kl": 0.5})])
    first.end(run, "failed")
    second = MlflowTracker(config)  # a new service process: it finds the run by its tag
    second.log(run, {"dp": "4"}, [ForwardedStep("actor", 2, 1_700_000_001.0, {"actor/kl": 0.25})])
    client = MlflowClient(tracking_uri=config.tracking_uri)
    runs = client.search_runs([client.get_experiment_by_name("restart").experiment_id])
    assert len(runs) == 1
    found = runs[0]
    assert found.info.status == "RUNNING" and found.info.run_name == "run.with:odd-name#1"
    assert [(m.step, m.value) for m in client.get_metric_history(found.info.run_id,
                                                                 "actor/kl")] == [(1, 0.5),
                                                                                  (2, 0.25)]
    # params cannot change in MLflow: the later value is a tag
    assert found.data.params["dp"] == "2" and found.data.tags["rlmon.setting.dp"] == "4"
