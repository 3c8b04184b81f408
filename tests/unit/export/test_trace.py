"""``rlmon trace``: a run's timelines, alerts and key metrics as a Perfetto trace, read back
with Perfetto's own proto classes and checked against the trace processor's rules."""

from __future__ import annotations

import time
import types
from pathlib import Path

import pytest

from rlmon.actors.reporter import Reporter
from rlmon.actors.reporter import facade as reporter_module
from rlmon.actors.reporter import packer as packer_module
from rlmon.actors.reporter.sink import LocalSink
from rlmon.cli import main
from rlmon.commands.trace import parse_steps
from rlmon.service.config import Settings
from rlmon.service.metrics import catalog
from rlmon.service.service_core import ServiceCore
from tests.support.perfetto_check import read_trace

S = 1_000_000_000


@pytest.fixture
def state_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Three steps of two roles (actor: 2 ranks; critic: 1) stored by a real service; rank
    dp=1's reward is NaN at step 1 (an alert)."""
    now = [0]
    monkeypatch.setattr(reporter_module, "time", types.SimpleNamespace(
        perf_counter_ns=lambda: now[0], time=time.time, monotonic=time.monotonic))
    settings = Settings.model_validate({"notifiers": {"console": {"enabled": False}},
                                        "outbox": {"path": str(tmp_path / "outbox.sqlite")}})
    service = ServiceCore(settings, state_dir=tmp_path)
    sink = LocalSink(on_record=lambda record: service.publish([record]))
    actors = [Reporter("grpo", "actor", rank={"dp": d}, world={"dp": 2}, sink=sink)
              for d in range(2)]
    critic = Reporter("grpo", "critic", rank={}, world={}, sink=sink)
    for step in range(3):
        for d, rep in enumerate(actors):
            now[0] = step * 10 * S
            with rep.span("rollout", batch=8), rep.span("generate", engine="vllm"):
                now[0] += (2 + d) * S
            with rep.span("train"):
                now[0] += 3 * S
            rep.record(catalog.REWARD, sum=float("nan") if step == 1 else 1.0, count=1)
            now[0] = (step + 1) * 10 * S
            rep.end_step(step)
        now[0] = step * 10 * S
        with critic.span("value"):
            now[0] += S
        now[0] = (step + 1) * 10 * S
        critic.end_step(step)
    for rep in [*actors, critic]:
        assert rep.flush(5)
        rep.close()
    service.close()
    return tmp_path


def test_trace_opens_as_drawn(state_dir: Path, tmp_path: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run.pftrace"
    assert main(["trace", "grpo", "--state-dir", str(state_dir), "-o", str(out)]) == 0
    said = capsys.readouterr().out
    assert "ui.perfetto.dev" in said and ": 3 steps of 2 roles, 3 ranks, " in said
    view = read_trace(out.read_bytes())
    offset = packer_module._WALL_OFFSET_NS
    # one process per (role, host), one thread per rank
    host = next(iter(view.processes.values())).split(" @ ")[1]
    assert sorted(view.processes.values()) == sorted(
        [f"actor @ {host}", f"critic @ {host}", "actor: run", "critic: run"])
    assert sorted(view.threads.values()) == [
        (f"actor @ {host}", "rank dp=0 cp=0 tp=0 pp=0"),
        (f"actor @ {host}", "rank dp=1 cp=0 tp=0 pp=0"),
        (f"critic @ {host}", "rank dp=0 cp=0 tp=0 pp=0")]
    slow = view.slices[(f"actor @ {host}", "rank dp=1 cp=0 tp=0 pp=0")]
    assert [(s.name, s.start - offset, s.end - offset, s.depth) for s in slow[:4]] == [
        ("step 0", 0, 10 * S, 0), ("rollout", 0, 3 * S, 1), ("generate", 0, 3 * S, 2),
        ("train", 3 * S, 6 * S, 1)]
    assert slow[1].annotations == {"batch": 8}
    assert slow[2].annotations == {"engine": "vllm"}
    assert slow[0].annotations == {"step": 0, "spans_cut": 0}
    assert [s.name for s in slow if s.depth == 0] == ["step 0", "step 1", "step 2"]
    # the NaN reward of step 1 fires an alert: an instant at the end of step 1
    alerts = view.instants[("actor: run", "alerts")]
    (alert,) = [i for i in alerts if i[1] == "NonFiniteMetric firing"]
    assert alert[0] - offset == 20 * S and alert[2]["step"] == 1
    assert alert[2]["metric"] == catalog.REWARD and alert[2]["severity"] == "critical"
    for role in ("actor", "critic"):  # each role's step time at the end of each step
        assert [(t - offset, v) for t, v in view.counters[(f"{role}: run", catalog.STEP_SECONDS)]
                ] == [(10 * S, 10.0), (20 * S, 10.0), (30 * S, 10.0)]
    rewards = view.counters[("actor: run", catalog.REWARD)]
    assert [(t - offset, v) for t, v in rewards] == [(10 * S, 1.0), (30 * S, 1.0)]  # NaN: none


def test_trace_of_one_role_and_a_step_range(state_dir: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "part.pftrace"
    assert main(["trace", "grpo", "--role", "critic", "--steps", "1:1", "--state-dir",
                 str(state_dir), "-o", str(out)]) == 0
    assert ": 1 step, 1 rank, " in capsys.readouterr().out
    assert main(["trace", "grpo", "--role", "actor", "--steps", "1:2", "--state-dir",
                 str(state_dir), "-o", str(out)]) == 0
    view = read_trace(out.read_bytes())
    assert all(not p.startswith("critic") for p in view.processes.values())
    steps = {s.name for slices in view.slices.values() for s in slices if s.depth == 0}
    assert steps == {"step 1", "step 2"}
    assert main(["trace", "other", "--state-dir", str(state_dir), "-o", str(out)]) == 1
    assert main(["trace", "grpo", "--state-dir", str(tmp_path / "none"), "-o", str(out)]) == 2


def test_parse_steps() -> None:
    assert parse_steps("3:7") == (3, 7)
    assert parse_steps("3:") == (3, None)
    assert parse_steps(":7") == (0, 7)
    assert parse_steps("4") == (4, 4)
