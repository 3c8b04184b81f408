"""The Reporter without Ray: exact values through the in-process sink, tensors, bounds, resends."""

from __future__ import annotations

import threading
import time
import types
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from rlmon.actors.reporter import Reporter
from rlmon.actors.reporter import facade as reporter_module
from rlmon.actors.reporter.sink import LocalSink
from rlmon.service.aggregation.aggregator import AggregatorCore
from rlmon.service.aggregation.watermark import WatermarkStore
from rlmon.service.contract.step_message import StepMessage
from rlmon.service.metrics import catalog
from rlmon.service.replay import replay
from tests.support.extras import optional_import
from tests.support.sinks import AggregatorSink


def _reporters(sink: LocalSink, run: str = "r", dp: int = 2, cp: int = 1) -> list[Reporter]:
    return [
        Reporter(run, "actor", rank={"dp": d, "cp": c}, world={"dp": dp, "cp": cp}, sink=sink,
                 step_seconds=False, hardware_interval=None)  # values compared across runs
        for d in range(dp) for c in range(cp)
    ]


def _drive(reps: list[Reporter]) -> None:
    for step in range(3):
        for i, rep in enumerate(reps):
            rep.record("actor/loss", sum=1.5 * i + step, count=2 + i)
            rep.record("actor/loss", sum=0.5, count=1)  # a second micro-batch merges locally
            rep.record("actor/is_ratio_max", max=1.0 + 0.1 * i)
            rep.record("actor/is_ratio_min", min=1.0 - 0.1 * i)
            rep.record("actor/grad_norm", sqsum=float(i + 1))
            rep.record("rollout/tokens", sum=10.0 * (i + 1))
            rep.record("actor/advantage_std", count=4, sum=float(i), sqsum=2.0 + i)
            rep.record("actor/lr", value=1e-6)
            rep.record("rollout/reward", sum=3.0, count=4, replicated=["cp"])
            rep.record("user/mb_loss", sum=float(i), count=1, minibatch_reduce="mean",
                       minibatch=i % 2)
            rep.end_step(step)
    for rep in reps:
        assert rep.flush(5)


def test_values_match_the_core_on_contract_records() -> None:
    """Every form through the Reporter gives what `rlmon replay` gives on the same records."""
    sink = LocalSink()
    _drive(_reporters(sink, dp=2, cp=2))
    msgs: list[StepMessage] = []

    class Capture:
        def send(self, messages: Sequence[StepMessage]) -> None:
            msgs.extend(messages)

    captured = _reporters(LocalSink(), dp=2, cp=2)
    for rep in captured:
        rep.sink = Capture()
    _drive(captured)
    lines = [_to_line(report) for msg in msgs for report in msg.reports()]
    expected = {r.step: dict(r.metrics) for r, _ in replay(lines).steps}
    got = {r.step: dict(r.metrics) for r in sink.records}
    assert got == expected
    assert got[0]["actor/loss"] == pytest.approx((0 + 1.5 + 3 + 4.5 + 2) / (2 + 3 + 4 + 5 + 4))
    assert got[0]["rollout/reward"] == 0.75
    assert got[0]["actor/grad_norm"] == pytest.approx(np.sqrt(10.0))
    assert got[0]["user/mb_loss"] == pytest.approx(((0 + 2) / 2 + (1 + 3) / 2) / 2)
    assert all(r.complete for r in sink.records)


def _to_line(report) -> str:  # type: ignore[no-untyped-def]
    import json

    from rlmon.service.metrics.spec import Form

    metrics = {}
    for name, p in report.metrics.items():
        keys = {
            Form.MEAN: ("sum", "count"), Form.SUM: ("sum",), Form.MIN: ("min",),
            Form.MAX: ("max",), Form.SQSUM: ("sqsum",), Form.MOMENTS: ("count", "sum", "sqsum"),
        }
        if p.form is Form.VALUE:
            body = {"value": p.state[0]}
        else:
            body = dict(zip(keys[p.form], p.state, strict=True))
        if p.replicated is not None:
            body["replicated"] = sorted(p.replicated)
        if p.minibatch_mean:
            body["minibatch_reduce"] = "mean"
        metrics[name] = body
    return json.dumps({
        "run": report.run, "role": report.role, "step": report.step,
        "rank": report.rank.as_dict(), "world": report.world.as_dict(), "final": report.final,
        "seq": report.seq, "minibatch": report.minibatch, "metrics": metrics,
    })


def test_tensor_statistics_masked_and_one_transfer() -> None:
    sink = LocalSink()
    (rep,) = _reporters(sink, dp=1)
    values = np.array([[1.0, 2.0, 3.0], [4.0, np.nan, 6.0]])
    mask = np.array([[1, 1, 0], [1, 0, 0]])
    rep.record_tensor("actor/entropy", values, mask)  # token mean over 3 tokens
    rep.record_tensor("actor/logp_diff", values, mask, reduce="seq_mean")
    rep.record_tensor("actor/is_ratio_max", values, mask, reduce="max")
    rep.record_tensor("actor/is_ratio_min", values, mask, reduce="min")
    rep.record_tensor("rollout/tokens", mask, reduce="sum")
    rep.record_tensor("actor/grad_norm", values, mask, reduce="sqsum")
    rep.end_step(0)
    assert rep.flush(5)
    (rec,) = sink.records
    assert rec.metrics["actor/entropy"] == pytest.approx(7 / 3)  # NaN is masked out
    assert rec.metrics["actor/logp_diff"] == pytest.approx((1.5 + 4.0) / 2)
    assert rec.metrics["actor/is_ratio_max"] == 4.0
    assert rec.metrics["actor/is_ratio_min"] == 1.0
    assert rec.metrics["rollout/tokens"] == 3.0
    assert rec.metrics["actor/grad_norm"] == pytest.approx(np.sqrt(1 + 4 + 16))
    assert rep.transfers == 0  # numpy: already on the host


@pytest.mark.torch
def test_torch_tensors_take_one_transfer_per_step() -> None:
    torch = optional_import("torch")
    sink = LocalSink()
    (rep,) = _reporters(sink, dp=1)
    v = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    for name in ("actor/entropy", "actor/kl", "actor/logp_diff"):
        rep.record_tensor(name, v, torch.tensor([[1, 0], [1, 1]]))
    rep.end_step(0)
    assert rep.flush(5)
    assert rep.transfers == 1
    assert sink.records[0].metrics["actor/kl"] == pytest.approx(8 / 3)


def test_span_records_max_timing_and_step_seconds_feeds_straggler(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With a controlled clock: the span is the slowest rank's, the straggler ratio is the
    slowest rank's step time over the median one."""
    clock = [0.0]
    fake = types.SimpleNamespace(
        perf_counter=lambda: clock[0], perf_counter_ns=lambda: round(clock[0] * 1e9),
        time=time.time, monotonic=time.monotonic)
    monkeypatch.setattr(reporter_module, "time", fake)
    sink = LocalSink()
    reps = [Reporter("r", "actor", rank={"dp": d}, world={"dp": 3}, sink=sink) for d in range(3)]
    spans, steps = [], []
    for d, rep in enumerate(reps):
        with rep.span("generate"):
            clock[0] += d + 1.0
        spans.append(d + 1.0)
        steps.append(clock[0])  # every rank's step began at 0
        rep.end_step(0)
    for rep in reps:
        assert rep.flush(5)
    (rec,) = sink.records
    assert rec.metrics["timing/generate_seconds"] == np.max(spans)
    per_rank = np.array(steps)
    assert rec.metrics[catalog.STRAGGLER_METRIC] == pytest.approx(
        np.max(per_rank) / np.median(per_rank))


def test_end_step_never_waits_drops_are_counted_and_resends_are_idempotent() -> None:
    """A sink that blocks, then fails, then recovers: the training thread never waits, the
    buffer stays bounded, what was dropped is counted, and every kept step counts once."""
    gate = threading.Event()
    inner = LocalSink()
    calls = {"n": 0}

    class Flaky:
        def send(self, messages: Sequence[StepMessage]) -> None:
            calls["n"] += 1
            gate.wait()
            if calls["n"] < 4:
                inner.send(messages)  # applied, but the ack is lost: the reporter resends
                raise ConnectionError("aggregator restarting")
            inner.send(messages)

    rep = Reporter("r", "actor", sink=Flaky(), max_pending=5, max_batch=2, step_seconds=False)
    for step in range(12):
        rep.record("actor/loss", sum=1.0, count=1.0)
        rep.end_step(step)  # returns although the sink is blocked on the gate
    assert not gate.is_set() and not inner.records  # so end_step returned before any delivery
    assert rep.pending <= 5
    assert rep.dropped >= 12 - 5 - 2  # oldest steps dropped beyond the bound
    gate.set()
    assert rep.flush(10)
    steps = sorted(r.step for r in inner.records)
    assert len(steps) == len(set(steps))  # no step counted twice
    assert all(r.metrics["actor/loss"] == 1.0 for r in inner.records)
    counters = inner.assembler.counters
    assert counters.duplicates + counters.late >= 3  # the resends, recognised and ignored
    assert 12 - rep.dropped == len(steps)
    rep.close()


def test_bad_rank_and_forms_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="outside world"):
        Reporter("r", "actor", rank={"dp": 2}, world={"dp": 2}, sink=LocalSink())
    rep = Reporter("r", "actor", sink=LocalSink())
    rep.record("actor/loss", sum=1.0, count=1.0)
    with pytest.raises(ValueError, match="actor/loss"):
        rep.record("actor/loss", max=1.0)
    with pytest.raises(ValueError, match="one statistic form"):
        rep.record("actor/loss")
    rep.close()


def test_a_value_too_large_for_a_float_is_dropped_and_the_sender_lives_on() -> None:
    sink = LocalSink()
    rep = Reporter("r", "actor", sink=sink, step_seconds=False)
    rep.record("x", sum=10**400)
    rep.end_step(0)
    rep.record("actor/loss", sum=3.0, count=2.0)
    rep.end_step(1)
    assert rep.flush(5)
    assert rep.dropped == 1
    assert rep.last_error is not None and "step 0" in rep.last_error
    assert "OverflowError" in rep.last_error
    assert [r.step for r in sink.records] == [1]
    assert sink.records[0].metrics["actor/loss"] == 1.5
    assert rep._delivery.alive
    rep.close()


def test_a_statistic_in_a_form_the_catalog_does_not_give_is_refused_alone(
        caplog: pytest.LogCaptureFixture) -> None:
    """actor/loss as a bare value (the catalog's is a token-weighted mean): that statistic is
    refused, counted, named, said once in the log; the rest of each step arrives."""
    sink = LocalSink()
    rep = Reporter("r", "actor", sink=sink, step_seconds=False, hardware_interval=None)
    with caplog.at_level("WARNING", logger="rlmon"):
        for step in range(3):
            rep.record("actor/loss", value=1.0)
            rep.record_many({"actor/lr": {"sum": 1.0}, "actor/grad_norm": 0.5})  # sum: not lr's
            rep.record("actor/entropy", sum=3.0, count=2.0)
            rep.end_step(step)
        assert rep.flush(5)
    assert [r.step for r in sink.records] == [0, 1, 2]
    assert all(dict(r.metrics) == {"actor/entropy": 1.5, "actor/grad_norm": 0.5}
               for r in sink.records)
    assert rep.rejected == 6 and rep.refused_messages == 0
    assert rep.last_error is not None and "actor/" in rep.last_error
    assert "catalog defines" in rep.last_error
    said = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(said) == 1 and "actor/loss" in said[0] and "'mean'" in said[0]
    rep.close()


def test_refused_statistics_reach_the_aggregator_count() -> None:
    """The Reporter's running refusal count rides on its messages: the aggregator's stats (the
    service exports them as rlmon_statistics_refused_total) hold it."""
    core = AggregatorCore()
    rep = Reporter("r", "actor", sink=AggregatorSink(core), step_seconds=False,
                   hardware_interval=None)
    for step in range(2):
        rep.record("actor/loss", value=1.0)  # refused: the catalog's is a mean
        rep.record("actor/entropy", sum=3.0, count=2.0)
        rep.end_step(step)
    assert rep.flush(5)
    assert core.stats().reporter_refused == 2 == rep.rejected
    rep.close()


def test_a_message_the_aggregator_refuses_is_counted_and_named(
        caplog: pytest.LogCaptureFixture) -> None:
    """A custom name sent as a value, then as a max: forms are fixed per name, so the aggregator
    refuses the second step; the Reporter counts it and names the reason (it was silent)."""
    sink = LocalSink()
    rep = Reporter("r", "actor", sink=sink, step_seconds=False, hardware_interval=None)
    rep.record("user/score", value=1.0)
    rep.end_step(0)
    rep.record("user/score", max=2.0)
    rep.end_step(1)
    rep.record("user/score", value=3.0)
    rep.end_step(2)
    rep.record("user/score", max=4.0)  # the same mistake again: counted, not said again
    rep.end_step(3)
    with caplog.at_level("WARNING", logger="rlmon"):
        assert rep.flush(5)
    assert [r.step for r in sink.records] == [0, 2]
    assert rep.refused_messages == 2
    said = [r.getMessage() for r in caplog.records if "aggregator refused" in r.getMessage()]
    assert len(said) == 1
    assert rep.last_error is not None and "refused by the aggregator" in rep.last_error
    assert "r/actor step " in rep.last_error and "user/score" in rep.last_error
    rep.close()


@pytest.mark.parametrize(("run", "role", "field"), [
    ("", "actor", "run"), ("a b", "actor", "run"), ("r" * 129, "actor", "run"),
    ("r", "Actor", "role"), ("r", "1x", "role"), ("r", "", "role"),
])
def test_bad_run_or_role_is_refused_at_construction(run: str, role: str, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        Reporter(run, role, sink=LocalSink())


def test_bad_step_count_or_name_is_refused_where_it_is_given() -> None:
    rep = Reporter("r", "actor", sink=LocalSink(), step_seconds=False)
    for bad in (-3, 2**53, 1.5, "4", True):
        with pytest.raises(ValueError, match="step"):
            rep.end_step(bad)  # type: ignore[arg-type]
    for count in (-5.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="actor/loss: count"):
            rep.record("actor/loss", sum=1.0, count=count)
        with pytest.raises(ValueError, match="user/m: count"):
            rep.record("user/m", count=count, sum=1.0, sqsum=1.0)
    for name in ("", "x" * 201, "a\nb"):
        with pytest.raises(ValueError, match="metric name"):
            rep.record(name, sum=1.0, count=1.0)
        with pytest.raises(ValueError, match="metric name"):
            rep.record(name, max=1.0)
    rep.record("actor/loss", sum=1.0, count=np.float64(-2.0))  # not a Python number: at pack time
    rep.end_step(2**53 - 1)
    assert rep.flush(5)
    assert rep.dropped == 1 and "count must be finite" in (rep.last_error or "")
    rep.close()


def test_an_idle_reporter_resends_to_a_restarted_aggregator(tmp_path: Path) -> None:
    """Rank 0 sent step 2 and has nothing more to send when the aggregator restarts; its flush
    must still get step 2 to the new aggregator, so step 2 completes with both ranks."""
    db = tmp_path / "watermark-0.sqlite"
    sink = AggregatorSink(AggregatorCore(store=WatermarkStore(db)))
    reps = [Reporter("r", "actor", rank={"dp": i}, world={"dp": 2}, sink=sink,
                     step_seconds=False) for i in range(2)]
    for step in range(2):
        for rep in reps:
            rep.record("rollout/tokens", sum=1.0)
            rep.end_step(step)
    reps[0].record("rollout/tokens", sum=1.0)
    reps[0].end_step(2)
    assert all(rep.flush(5) for rep in reps)
    sink.core = AggregatorCore(store=WatermarkStore(db))  # restart: open step 2 is lost
    assert reps[0].flush(5)  # probes, sees the new incarnation, resends step 2
    assert reps[0].resent >= 1
    reps[1].record("rollout/tokens", sum=1.0)
    reps[1].end_step(2)
    assert reps[1].flush(5)
    records = {r.step: r for r in sink.core.pending_records()}
    assert records[2].complete and records[2].metrics["rollout/tokens"] == 2.0
    for rep in reps:
        rep.close()
