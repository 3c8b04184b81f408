"""The Reporter without Ray: exact values through the in-process sink, tensors, bounds, resends."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import numpy as np
import pytest
from extras import optional_import

from rlmon.actors.message import StepMessage
from rlmon.actors.reporter import LocalSink, Reporter
from rlmon.service import catalog
from rlmon.service.replay import replay


def _reporters(sink: LocalSink, run: str = "r", dp: int = 2, cp: int = 1) -> list[Reporter]:
    return [
        Reporter(run, "actor", rank={"dp": d, "cp": c}, world={"dp": dp, "cp": cp}, sink=sink,
                 step_seconds=False)
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

    from rlmon.service.spec import Form

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


def test_span_records_max_timing_and_step_seconds_feeds_straggler() -> None:
    sink = LocalSink()
    reps = [Reporter("r", "actor", rank={"dp": d}, world={"dp": 3}, sink=sink) for d in range(3)]
    for rep in reps:
        with rep.span("generate"):
            pass
        rep.end_step(0)
    for rep in reps:
        assert rep.flush(5)
    (rec,) = sink.records
    assert "timing/generate_seconds" in rec.metrics
    assert catalog.STRAGGLER_METRIC in rec.metrics


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
    start = time.perf_counter()
    for step in range(12):
        rep.record("actor/loss", sum=1.0, count=1.0)
        rep.end_step(step)
    assert time.perf_counter() - start < 0.5  # the sink is blocked; end_step did not wait
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
