"""record_sample_tensor on torch: ranked on the device exactly as the host reference ranks,
fetched with the step's single copy, no host sync in the call, payloads for the selected only."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlmon.actors.reporter import Reporter
from rlmon.actors.reporter.sample_capture import pick_array, pick_tensor
from rlmon.actors.reporter.sink import LocalSink
from rlmon.service.metrics import catalog
from tests.support.extras import optional_import

pytestmark = pytest.mark.torch
torch = optional_import("torch")
from tests.support.torch_support import OpCounter  # noqa: E402

_VALUE = st.sampled_from([0.0, 0.25, 1.0, 3.0, -1.0, math.inf, -math.inf, math.nan])


@settings(max_examples=120, deadline=None)
@given(data=st.data(), rows=st.integers(1, 12), width=st.integers(0, 5),
       score=st.sampled_from(["mean", "max", "min", "sum"]), k=st.integers(1, 6),
       largest=st.booleans(), masked=st.booleans(),
       dtype=st.sampled_from(["float32", "float64", "bfloat16", "int64"]))
def test_the_device_ranking_is_the_host_reference(
        data: st.DataObject, rows: int, width: int, score: str, k: int, largest: bool,
        masked: bool, dtype: str) -> None:
    shape = (rows, width) if width else (rows,)
    values = torch.tensor(data.draw(st.lists(_VALUE, min_size=math.prod(shape),
                                             max_size=math.prod(shape))),
                          dtype=torch.float64).reshape(shape)
    if dtype == "int64":
        values = torch.nan_to_num(values, nan=7.0, posinf=9.0, neginf=-9.0)
    values = values.to(getattr(torch, dtype))
    mask = torch.tensor(data.draw(st.lists(st.booleans(), min_size=math.prod(shape),
                                           max_size=math.prod(shape)))).reshape(shape) \
        if masked else None
    piece, n = pick_tensor(values, mask, score, k, largest)
    s = piece.tolist()
    got = [(s[j], int(s[n + j])) for j in range(n) if s[2 * n + j]]
    want = pick_array(values.to(torch.float64).numpy(),
                      None if mask is None else mask.numpy(), score, k, largest)
    assert [i for _, i in got] == [i for _, i in want]
    assert [a for a, _ in got] == pytest.approx([b for b, _ in want], nan_ok=True, rel=1e-12)


def test_one_copy_per_step_with_tensor_statistics_and_no_sync_in_the_call() -> None:
    sink = LocalSink()
    rep = Reporter("r", "actor", sink=sink, step_seconds=False, rank={"dp": 0},
                   world={"dp": 1})
    logp_trainer = torch.randn(16, 32, dtype=torch.float32)
    logp_rollout = logp_trainer.clone()
    logp_rollout[5] -= 2.0  # a corrupted sequence
    mask = torch.ones(16, 32, dtype=torch.bool)
    mask[5, 20:] = False
    texts = [f"response {i}" for i in range(16)]
    asked: list[int] = []

    def payload(i: int) -> str:
        asked.append(i)
        return texts[i]

    diff = (logp_trainer - logp_rollout).abs()
    rep.record_tensor(catalog.LOGP_DIFF, diff, mask)
    with OpCounter() as ops:
        rep.record_sample_tensor(catalog.LOGP_DIFF_WORST, diff, mask, score="mean", k=2,
                                 payload=payload)
    assert not [op for op in ops.ops if "_local_scalar_dense" in op or "item" in op]
    assert not asked  # nothing asked before the step's copy
    rep.end_step(0)
    assert rep.flush(10)
    assert rep.transfers == 1  # samples and statistics in one copy
    (record,) = sink.records
    (worst, *_rest) = record.samples[catalog.LOGP_DIFF_WORST]
    assert worst[1:] == ("dp0/5", "response 5") and worst[0] == pytest.approx(2.0)
    assert len(asked) == 2 and record.metrics[catalog.LOGP_DIFF_WORST] == worst[0]
    rep.close()


def test_ids_from_a_tensor_and_the_default_ids_count_sequences_across_calls() -> None:
    sink = LocalSink()
    rep = Reporter("r", "actor", sink=sink, step_seconds=False, rank={"dp": 3},
                   world={"dp": 4})
    rep.record_sample_tensor("custom/a", torch.tensor([1.0, 5.0]), k=1,
                             ids=torch.tensor([101, 102]))
    rep.record_sample_tensor("custom/b", torch.tensor([1.0, 5.0]), k=1)
    rep.record_sample_tensor("custom/b", torch.tensor([9.0, 0.0]), k=1)  # a second micro-batch
    for dp in range(3):
        other = Reporter("r", "actor", sink=sink, step_seconds=False, rank={"dp": dp},
                         world={"dp": 4})
        other.end_step(0)
        assert other.flush(10)
        other.close()
    rep.end_step(0)
    assert rep.flush(10)
    (record,) = sink.records
    assert record.samples["custom/a"] == ((5.0, "102", ""),)
    assert record.samples["custom/b"] == ((9.0, "dp3/2", ""),)
    assert np.isfinite(record.metrics["custom/b"])
    rep.close()
