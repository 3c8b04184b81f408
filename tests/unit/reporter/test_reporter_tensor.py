"""record_tensor on torch: the op budget per call and per step, float64 exactness against numpy
on the un-split data, how long references are held, and tensors changed in place."""

from __future__ import annotations

import gc
import math
import weakref
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlmon.actors.reporter import Reporter, tensor_stats
from rlmon.actors.reporter import facade as reporter_module
from rlmon.actors.reporter.sink import LocalSink
from rlmon.actors.reporter.tensor_stats import REDUCE_FORMS, reduce_array
from rlmon.service.metrics.forms import FORMS, Merge
from tests.support.extras import optional_import

pytestmark = pytest.mark.torch
torch = optional_import("torch")
from tests.support.torch_support import OpCounter  # noqa: E402

OPS_PER_CALL_BUDGET = 1.5
MICRO_BATCHES, PER_MASK = 8, 25


def _reporter(sink: LocalSink) -> Reporter:
    return Reporter("t", "actor", rank={"dp": 0}, world={"dp": 1}, sink=sink, step_seconds=False,
                    hardware_interval=None)  # the step holds what the test recorded, nothing else


def _step_tensors(requires_grad: bool) -> list[tuple[Any, list[Any]]]:
    gen = torch.Generator().manual_seed(0)
    out = []
    for _ in range(MICRO_BATCHES):
        mask = torch.rand(4, 64, generator=gen) > 0.2
        values = [torch.randn(4, 64, generator=gen, requires_grad=requires_grad) * 1.0
                  for _ in range(PER_MASK)]
        out.append((mask, values))
    return out


@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("reduce", sorted(REDUCE_FORMS))
def test_ops_per_call_and_per_step_within_budget(reduce: str, requires_grad: bool) -> None:
    """200 record_tensor calls (8 micro-batches of 25 sharing a mask) + end_step dispatch at most
    1.5 ATen ops per call on the training thread; a call itself dispatches none (a detach when
    the tensor requires grad)."""
    sink = LocalSink()
    rep = _reporter(sink)
    data = _step_tensors(requires_grad)
    with OpCounter() as calls:
        for mb, (mask, values) in enumerate(data):
            for i, v in enumerate(values):
                rep.record_tensor(f"user/m{mb}_{i}", v, mask, reduce=reduce)  # type: ignore[arg-type]
    with OpCounter() as ending:
        rep.end_step(0)
    assert rep.flush(10)
    n_calls = MICRO_BATCHES * PER_MASK
    assert len(calls.ops) == (n_calls if requires_grad else 0), calls.ops[:5]
    per_call = (len(calls.ops) + len(ending.ops)) / n_calls
    assert per_call <= OPS_PER_CALL_BUDGET, (per_call, ending.ops)
    assert len(sink.records[0].metrics) == n_calls
    assert rep.transfers == 1


def test_end_micro_batch_folds_without_a_copy_and_step_copies_once() -> None:
    sink = LocalSink()
    rep = _reporter(sink)
    per_fold = []
    for mask, values in _step_tensors(False):
        for i, v in enumerate(values):
            rep.record_tensor(f"user/m{i}", v, mask)
        with OpCounter() as fold:
            rep.end_micro_batch()
        per_fold.append(len(fold.ops))
    # stack, multiply by the mask, sum, and the sum read on the host to see it finite (on CPU;
    # elsewhere a where, no read); one count (reshape, sum)
    assert max(per_fold) <= 7, per_fold
    rep.end_step(0)
    assert rep.flush(10)
    assert rep.transfers == 1


def _split_points(draw: Any, n: int) -> list[int]:
    cuts = sorted(draw(st.lists(st.integers(0, n), max_size=4)))
    return [0, *cuts, n]


@st.composite
def _cases(draw: Any) -> tuple[str, str, np.ndarray, np.ndarray, list[int], list[bool]]:
    reduce = draw(st.sampled_from(sorted(REDUCE_FORMS)))
    dtype = draw(st.sampled_from(["float32", "float64", "bfloat16"]))
    rows, cols = draw(st.integers(0, 7)), draw(st.integers(1, 9))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    values = rng.standard_normal((rows, cols)) * draw(st.sampled_from([1e-3, 1.0, 1e4]))
    mask = rng.random((rows, cols)) < draw(st.sampled_from([0.0, 0.3, 0.9, 1.0]))
    cuts = _split_points(draw, rows)
    folds = draw(st.lists(st.booleans(), min_size=len(cuts), max_size=len(cuts)))
    return reduce, dtype, values, mask, cuts, folds


@settings(max_examples=150, deadline=None)
@given(_cases())
def test_any_split_over_calls_equals_float64_reference(
    case: tuple[str, str, np.ndarray, np.ndarray, list[int], list[bool]],
) -> None:
    """Recorded in pieces (rows split over calls, folded anywhere in between),
    the step's value is the float64 reference on the whole data."""
    reduce, dtype, values, mask, cuts, folds = case
    tensor = torch.tensor(values, dtype=getattr(torch, dtype))
    exact = tensor.double().numpy()  # the values as the tensor holds them, widened exactly
    sink = LocalSink()
    rep = _reporter(sink)
    for start, stop, fold in zip(cuts, cuts[1:], folds, strict=False):
        rows = slice(start, stop)
        rep.record_tensor("user/x", tensor[rows], torch.tensor(mask[rows]),
                          reduce=reduce)  # type: ignore[arg-type]
        if fold:
            rep.end_micro_batch()
    rep.end_step(0)
    assert rep.flush(10)
    ref = reduce_array(exact, mask, reduce)
    spec = FORMS[REDUCE_FORMS[reduce]]
    got = sink.records[0].metrics.get("user/x")
    if ref["count"] == 0 and spec.columnar is not Merge.ADD:
        assert got is None  # an extreme of nothing is not reported
        return
    want = spec.finalize(spec.state(ref))
    if want is None or got is None:
        assert want is got
        return
    scale = float(np.abs(exact[mask]).max()) if mask.any() else 1.0
    if reduce in ("min", "max"):
        assert got == want
    elif reduce in ("sqsum", "std"):
        assert math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12 * scale)
    else:
        assert math.isclose(got, want, rel_tol=1e-12, abs_tol=1e-12 * scale)


def test_float64_accumulation_keeps_what_float32_would_lose() -> None:
    """2^24 + 1 ones in float32 sum to 2^24 in float32; the Reporter accumulates in float64."""
    sink = LocalSink()
    rep = _reporter(sink)
    ones = torch.ones(2**24 + 1, dtype=torch.float32)
    assert float(ones.sum()) == 2.0**24
    rep.record_tensor("rollout/tokens", ones, reduce="sum")
    rep.end_step(0)
    assert rep.flush(10)
    assert sink.records[0].metrics["rollout/tokens"] == 2.0**24 + 1


def test_references_are_released_at_the_fold() -> None:
    sink = LocalSink()
    rep = _reporter(sink)
    values, mask = torch.rand(4, 8), torch.rand(4, 8) > 0.5
    alive = weakref.ref(values)
    rep.record_tensor("actor/entropy", values, mask)
    del values
    gc.collect()
    assert alive() is not None  # held until the fold
    rep.end_micro_batch()
    gc.collect()
    assert alive() is None
    rep.end_step(0)
    assert rep.flush(10)
    assert "actor/entropy" in sink.records[0].metrics


def test_held_elements_bound_folds_inside_record_tensor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reporter_module, "MAX_HELD_ELEMENTS", 100)
    rep = _reporter(LocalSink())
    first = torch.rand(8, 8)
    alive = weakref.ref(first)
    rep.record_tensor("user/a", first)
    rep.record_tensor("user/b", torch.rand(8, 8))  # 128 elements held > 100: folded
    del first
    gc.collect()
    assert alive() is None
    rep.close()


@pytest.mark.parametrize("target", ["values", "mask"])
def test_a_tensor_changed_in_place_before_the_fold_is_refused(target: str) -> None:
    sink = LocalSink()
    rep = _reporter(sink)
    values, mask = torch.ones(2, 4), torch.ones(2, 4, dtype=torch.bool)
    rep.record_tensor("actor/entropy", values, mask)
    rep.record_tensor("actor/kl", torch.ones(2, 4))
    (values if target == "values" else mask).zero_()
    rep.end_step(0)
    assert rep.flush(10)
    assert rep.rejected == 1
    assert rep.last_error is not None and "actor/entropy" in rep.last_error
    assert "actor/entropy" not in sink.records[0].metrics
    assert sink.records[0].metrics["actor/kl"] == 1.0  # the rest of the step is sent


def test_changing_a_tensor_after_end_micro_batch_is_safe() -> None:
    sink = LocalSink()
    rep = _reporter(sink)
    buffer = torch.full((2, 4), 3.0)
    rep.record_tensor("actor/entropy", buffer)
    rep.end_micro_batch()
    buffer.fill_(5.0)  # a reused buffer: the next micro-batch
    rep.record_tensor("actor/entropy", buffer)
    rep.end_step(0)
    assert rep.flush(10)
    assert rep.rejected == 0
    assert sink.records[0].metrics["actor/entropy"] == 4.0


def test_a_tensor_requiring_grad_is_held_detached() -> None:
    sink = LocalSink()
    rep = _reporter(sink)
    weights = torch.rand(4, 8, requires_grad=True)
    loss = weights * 2.0
    rep.record_tensor("actor/loss", loss)
    ((held, _, _),) = next(iter(rep._tensors._groups.values())).items  # (tensor, version, stat)
    assert held.grad_fn is None and not held.requires_grad
    loss.sum().backward()  # the caller's backward is unaffected
    rep.end_step(0)
    assert rep.flush(10)
    assert sink.records[0].metrics["actor/loss"] == pytest.approx(float(weights.detach().mean()) * 2)


@pytest.mark.parametrize("dtype", ["int64", "bool", "float16"])
def test_other_dtypes(dtype: str) -> None:
    sink = LocalSink()
    rep = _reporter(sink)
    data = np.array([[3, 0, 1], [2, 5, 0]])
    values = torch.tensor(data).to(getattr(torch, dtype))
    mask = torch.tensor([[1, 1, 0], [0, 1, 1]])
    for reduce in sorted(REDUCE_FORMS):
        rep.record_tensor(f"user/{reduce}", values, mask, reduce=reduce)  # type: ignore[arg-type]
    rep.end_step(0)
    assert rep.flush(10)
    exact = values.double().numpy()
    for reduce in sorted(REDUCE_FORMS):
        spec = FORMS[REDUCE_FORMS[reduce]]
        want = spec.finalize(spec.state(reduce_array(exact, mask.numpy(), reduce)))
        assert sink.records[0].metrics[f"user/{reduce}"] == pytest.approx(want, rel=1e-12)


def test_a_form_conflict_raises_at_record_or_is_refused_after() -> None:
    sink = LocalSink()
    rep = _reporter(sink)
    rep.record("user/a", max=1.0)
    with pytest.raises(ValueError, match="user/a"):
        rep.record_tensor("user/a", torch.ones(3))
    rep.record_tensor("user/b", torch.ones(3), reduce="max")
    with pytest.raises(ValueError, match="user/b"):
        rep.record_tensor("user/b", torch.ones(3))
    rep.record("user/b", sum=1.0, count=1.0)  # found when the step's tensors are merged
    rep.end_step(0)
    assert rep.flush(10)
    assert rep.rejected == 1 and "user/b" in (rep.last_error or "")
    assert sink.records[0].metrics["user/b"] == 1.0


def test_a_name_from_an_earlier_step_is_checked_again_for_its_form() -> None:
    """record_tensor keeps each name's statistic across steps (its fast path): a form conflict
    with record() in a later step still raises at the call, and another reduce mode of the
    same form takes a statistic of its own."""
    rep = _reporter(LocalSink())
    rep.record_tensor("user/a", torch.tensor([1.0, 5.0]), reduce="max")
    rep.end_step(0)
    rep.record("user/a", sum=1.0, count=1.0)
    with pytest.raises(ValueError, match="user/a"):
        rep.record_tensor("user/a", torch.tensor([2.0]), reduce="max")
    rep.close(1.0)
    sink = LocalSink()
    rep = _reporter(sink)
    values = torch.tensor([[1.0, 3.0, 0.0], [8.0, 0.0, 0.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    rep.record_tensor("user/m", values, mask)  # token mean: 12 / 3
    rep.end_step(0)
    rep.record_tensor("user/m", values, mask, reduce="seq_mean")  # (2 + 8) / 2 sequences
    rep.record_tensor("user/m", values[:1], mask[:1], reduce="seq_mean")  # + 2 / 1
    rep.end_step(1)
    assert rep.flush(10)
    assert [r.metrics["user/m"] for r in sink.records] == [4.0, 4.0]
    assert rep.rejected == 0


def test_mask_shape_and_seq_mean_axis_are_checked_at_the_call() -> None:
    rep = _reporter(LocalSink())
    with pytest.raises(ValueError, match="mask shape"):
        rep.record_tensor("user/a", torch.ones(2, 3), torch.ones(3, 2))
    with pytest.raises(ValueError, match="seq_mean"):
        rep.record_tensor("user/a", torch.tensor(1.0), reduce="seq_mean")
    rep.close()


@pytest.mark.parametrize("batch_elements", [1, 3000, 1 << 30])
def test_many_masks_modes_and_dtypes_folded_together_equal_the_reference(
    monkeypatch: pytest.MonkeyPatch, batch_elements: int,
) -> None:
    """Micro-batches with masks of their own, several reduce modes and dtypes under one mask,
    0-d values, an integer mask and unmasked tensors, folded at end_step (so groups of several
    masks are reduced together, CPU_BATCH_ELEMENTS at a time): every statistic is the float64
    reference on its whole data."""
    monkeypatch.setattr(tensor_stats, "CPU_BATCH_ELEMENTS", batch_elements)
    gen = torch.Generator().manual_seed(3)
    sink = LocalSink()
    rep = _reporter(sink)
    data: dict[str, tuple[str, list[np.ndarray], list[np.ndarray]]] = {}

    def record(name: str, values: Any, mask: Any, reduce: str) -> None:
        rep.record_tensor(name, values, mask, reduce=reduce)  # type: ignore[arg-type]
        shown = values.double().numpy()
        held = np.ones(shown.shape, bool) if mask is None else mask.numpy().astype(bool)
        entry = data.setdefault(name, (reduce, [], []))
        entry[1].append(shown.reshape(-1, *shown.shape[-1:]) if shown.ndim else shown.reshape(1, 1))
        entry[2].append(held.reshape(-1, *held.shape[-1:]) if held.ndim else held.reshape(1, 1))

    for mb in range(6):
        mask = torch.rand(3, 5, generator=gen) > 0.4
        if mb == 2:
            mask = mask.to(torch.int64)  # a non-bool mask
        if mb == 4:
            mask = torch.zeros(3, 5, dtype=torch.bool)  # nothing selected
        scalar_mask = torch.tensor(mb % 2 == 0)
        for reduce in sorted(REDUCE_FORMS):
            for dtype in (torch.float32, torch.bfloat16, torch.int64):
                values = (torch.randn(3, 5, generator=gen) * 10).to(dtype)
                record(f"user/{reduce}_{str(dtype)[6:]}", values, mask, reduce)
            if reduce != "seq_mean":
                record(f"user/{reduce}_scalar", torch.randn((), generator=gen), scalar_mask,
                       reduce)
            record(f"user/{reduce}_plain", torch.randn(2, 3 + mb % 2, generator=gen), None,
                   reduce)
    rep.end_step(0)
    assert rep.flush(10)
    assert rep.transfers == 1
    got = sink.records[0].metrics
    for name, (reduce, values_list, masks_list) in data.items():
        spec = FORMS[REDUCE_FORMS[reduce]]
        if reduce == "seq_mean" or name.endswith("_plain"):  # rows of their own width
            parts = [reduce_array(v, m, reduce) for v, m in zip(values_list, masks_list,
                                                                  strict=True)]
            ref = {key: _combine_numbers(key, [p[key] for p in parts]) for key in parts[0]}
        else:
            flat_v = np.concatenate([v.ravel() for v in values_list])
            flat_m = np.concatenate([m.ravel() for m in masks_list])
            ref = reduce_array(flat_v, flat_m, reduce)
        if ref["count"] == 0 and spec.columnar is not Merge.ADD:
            assert name not in got
            continue
        want = spec.finalize(spec.state(ref))
        if reduce in ("min", "max"):
            assert got[name] == want, name
        else:
            assert got[name] == pytest.approx(want, rel=1e-9, abs=1e-12), name


def _combine_numbers(key: str, numbers: list[float]) -> float:
    if key == "min":
        return min(numbers)
    if key == "max":
        return max(numbers)
    return math.fsum(numbers)


@pytest.mark.parametrize("reduce", ["token_mean", "seq_mean", "sum", "sqsum", "std"])
def test_inf_and_nan_outside_the_mask_are_ignored_and_inside_it_kept(reduce: str) -> None:
    """Padding often holds inf or NaN: outside the mask it changes nothing (on CPU the sums are
    first taken with a multiply by the mask, then again with where when one is not finite);
    inside the mask NaN is the answer."""
    sink = LocalSink()
    rep = _reporter(sink)
    values = torch.tensor([[1.0, 2.0, math.inf], [3.0, math.nan, -math.inf]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    rep.record_tensor("user/padded", values, mask, reduce=reduce)  # type: ignore[arg-type]
    rep.record_tensor("user/clean", values.nan_to_num(0.0, 0.0, 0.0), mask,
                      reduce=reduce)  # type: ignore[arg-type]
    inside = values.clone()
    inside[0, 0] = math.nan
    rep.record_tensor("user/nan", inside, mask, reduce=reduce)  # type: ignore[arg-type]
    rep.end_step(0)
    assert rep.flush(10)
    got = sink.records[0].metrics
    spec = FORMS[REDUCE_FORMS[reduce]]
    want = spec.finalize(spec.state(reduce_array(values.nan_to_num(0.0, 0.0, 0.0).numpy(),
                                                 mask.numpy(), reduce)))
    assert got["user/padded"] == pytest.approx(want, rel=1e-12)
    assert got["user/clean"] == pytest.approx(want, rel=1e-12)
    assert math.isnan(got["user/nan"])
