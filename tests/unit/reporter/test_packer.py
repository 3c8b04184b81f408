"""The step packer alone: an accumulator of sufficient statistics in, one StepMessage out."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest

from rlmon.actors.reporter import packer as packer_module
from rlmon.actors.reporter.accumulator import Accumulator, RawStep, add_partial
from rlmon.actors.reporter.delivery import Stamp
from rlmon.actors.reporter.packer import Origin, StepPacker
from rlmon.actors.reporter.tally import Tally
from rlmon.service.metrics import catalog
from rlmon.service.metrics.forms import FORMS
from rlmon.service.metrics.partial import Partial
from rlmon.service.metrics.rank import Rank, World
from rlmon.service.metrics.spec import Form

STAMP = Stamp(seq=7, dropped=2, started=1.5e9)


def _packer(tally: Tally | None = None) -> StepPacker:
    return StepPacker(Origin("run", "actor", Rank(dp=1), World(dp=2)),
                      tally if tally is not None else Tally("run", "actor"))


def _raw(acc: Accumulator, batches: Sequence[Mapping[str, Any]] = (), step: int = 3,
         ) -> RawStep:
    return RawStep(step, acc, 123.0, None, batches, [], None)


def _partials(msg: Any) -> dict[str, Partial]:
    """Every partial of the message: the columnar block and the others, by name."""
    found = dict(msg.columns.partials()) if msg.columns is not None else {}
    for _, group in msg.partials:
        found.update(group)
    return found


def test_packed_sufficient_statistics_equal_numpy_over_the_micro_batches() -> None:
    rng = np.random.default_rng(5)
    micro = [rng.normal(size=(16, 32)).astype(np.float32) for _ in range(4)]
    masks = [rng.random((16, 32)) < 0.7 for _ in range(4)]
    acc: Accumulator = {}
    for values, mask in zip(micro, masks, strict=True):
        kept = values[mask].astype(np.float64)
        add_partial(acc, "user/loss", Form.MEAN, (kept.sum(), float(mask.sum())), None, None, 0)
        add_partial(acc, "user/total", Form.SUM, (kept.sum(),), None, None, 0)
        add_partial(acc, "user/low", Form.MIN, (kept.min(),), None, None, 0)
        add_partial(acc, "user/high", Form.MAX, (kept.max(),), None, None, 0)
        add_partial(acc, "user/norm", Form.SQSUM, ((kept ** 2).sum(),), None, None, 0)
        add_partial(acc, "user/spread", Form.MOMENTS, FORMS[Form.MOMENTS].state(
            {"count": kept.size, "sum": kept.sum(), "sqsum": (kept ** 2).sum()}), None, None, 0)
    msg = _packer()(_raw(acc), STAMP)
    everything = np.concatenate([v[m].astype(np.float64) for v, m in zip(micro, masks,
                                                                        strict=True)])
    got = _partials(msg)
    final = {name: FORMS[p.form].finalize(p.state) for name, p in got.items()}
    assert final["user/loss"] == pytest.approx(everything.mean(), rel=1e-12)
    assert final["user/total"] == pytest.approx(everything.sum(), rel=1e-12)
    assert final["user/low"] == everything.min() and final["user/high"] == everything.max()
    assert final["user/norm"] == pytest.approx(np.linalg.norm(everything), rel=1e-12)
    assert final["user/spread"] == pytest.approx(everything.std(), rel=1e-9)
    assert msg.columns is not None and set(msg.columns.schema.names) == set(got)  # all plain
    assert msg.columns.values.dtype == np.float64


def test_the_message_carries_origin_stamp_and_refusal_count() -> None:
    tally = Tally("run", "actor")
    tally.rejected = 4
    acc: Accumulator = {}
    add_partial(acc, "user/x", Form.MEAN, (1, 2), None, None, 0)
    msg = _packer(tally)(_raw(acc, step=9), STAMP)
    assert (msg.run, msg.role, msg.step, msg.rank, msg.world) == (
        "run", "actor", 9, Rank(dp=1), World(dp=2))
    assert (msg.seq, msg.dropped, msg.started, msg.time, msg.refused) == (7, 2, 1.5e9, 123.0, 4)
    assert msg.timeline is None and not msg.resend


def test_replicated_and_per_mini_batch_partials_travel_outside_the_block() -> None:
    acc: Accumulator = {}
    add_partial(acc, "user/lr", Form.MAX, (0.5,), "all", None, 0)
    for mb in range(2):
        add_partial(acc, "user/mb_loss", Form.MEAN, (float(mb), 2.0), None, "mean", mb)
    msg = _packer()(_raw(acc), STAMP)
    assert msg.columns is None
    groups = dict(msg.partials)
    assert sorted(groups) == [0, 1]
    assert groups[0]["user/lr"].replicated is not None
    assert groups[1]["user/mb_loss"].state == (1.0, 2.0) and groups[1]["user/mb_loss"].minibatch_mean


def test_record_many_batches_merge_into_the_step_and_bad_statistics_are_refused_alone() -> None:
    tally = Tally("run", "actor")
    acc: Accumulator = {}
    add_partial(acc, catalog.LOSS, Form.MEAN, (1.0, 1.0), None, None, 0)
    batches: list[dict[str, Any]] = [
        {catalog.LOSS: (3.0, 1.0), "user/peak": {"max": 2.0}, "user/bad": (1.0, -1.0)},
        {"user/peak": {"max": 5.0}, "user/odd": {"max": 1.0, "sum": 2.0}}]
    msg = _packer(tally)(_raw(acc, batches), STAMP)
    got = _partials(msg)
    assert got[catalog.LOSS].state == (4.0, 2.0)
    assert got["user/peak"].state == (5.0,)
    assert "user/bad" not in got and "user/odd" not in got
    assert tally.rejected == 2 and tally.last_error is not None
    assert tally.last_error.startswith("user/bad: count must be finite")


def test_a_form_the_catalog_does_not_give_is_refused_and_the_rest_packed() -> None:
    tally = Tally("run", "actor")
    acc: Accumulator = {}
    add_partial(acc, catalog.LOSS, Form.VALUE, (2.0, 2.0), None, None, 0)  # a mean in the catalog
    add_partial(acc, "user/x", Form.SUM, (1.0,), None, None, 0)
    got = _partials(_packer(tally)(_raw(acc), STAMP))
    assert list(got) == ["user/x"]
    assert tally.rejected == 1 and tally.last_error is not None
    assert tally.last_error.startswith(catalog.LOSS)


@pytest.mark.parametrize("count", [-1.0, math.inf, math.nan])
def test_a_bad_count_makes_the_step_unpackable(count: float) -> None:
    acc: Accumulator = {"user/x": [Form.MEAN, (np.float32(1.0), count), None, False, 0]}
    with pytest.raises(ValueError, match="user/x: count must be finite and >= 0"):
        _packer()(_raw(acc), STAMP)


def test_spans_become_unix_time_with_normalized_attributes() -> None:
    acc: Accumulator = {}
    spans = [("generate", 10, 20, 0, {"engine": "vllm", "obj": object()}), ("train", 20, 40, 0,
                                                                              None)]
    msg = _packer()(RawStep(0, acc, 1.0, None, [], [], (5, 50, spans, 3)), STAMP)
    tl = msg.timeline
    assert tl is not None
    shift = packer_module._WALL_OFFSET_NS
    assert (tl.start_ns - shift, tl.end_ns - shift, tl.cut) == (5, 50, 3)
    assert [(s.name, s.start_ns - shift, s.end_ns - shift) for s in tl.spans] == [
        ("generate", 10, 20), ("train", 20, 40)]
    attrs = dict(tl.spans[0].attrs)
    assert attrs["engine"] == "vllm" and isinstance(attrs["obj"], str)
    assert tl.host and tl.pid > 0
