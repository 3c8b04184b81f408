"""Property tests: any split over DP ranks, CP shards and micro-batches, in any arrival order, gives
the value numpy computes on the un-split data (docs/design.md, "Ship sufficient statistics, reduce
once").
"""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlmon.service.aggregation.assembly import StepAssembler
from rlmon.service.aggregation.step_state import StepState
from rlmon.service.contract.records import Report, parse_report
from rlmon.service.metrics.partial import Partial, combine
from rlmon.service.metrics.rank import Rank, World
from rlmon.service.metrics.spec import Form

# no time limit per example, and none on generating them: a loaded CI box is slow, not wrong
SLOW_OK = [HealthCheck.too_slow]

finite = st.floats(min_value=-1e3, max_value=1e3, allow_nan=False, allow_infinity=False)
weights = st.floats(min_value=0.0, max_value=50.0, allow_nan=False, allow_infinity=False)


def close(got: float | None, want: float, scale: float) -> bool:
    assert got is not None
    return math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-9 * max(scale, 1.0))


@st.composite
def split_data(draw: st.DrawFn, *, positive_weights: bool = True) -> dict[str, Any]:
    n = draw(st.integers(min_value=1, max_value=60))
    values = draw(st.lists(finite, min_size=n, max_size=n))
    w = draw(st.lists(weights if positive_weights else finite, min_size=n, max_size=n))
    dp = draw(st.integers(1, 4))
    cp = draw(st.integers(1, 3))
    micro = draw(st.integers(1, 3))
    # Each element lands on one (dp, cp, micro-batch) cell; cells may be empty.
    cells = draw(st.lists(st.integers(0, dp * cp * micro - 1), min_size=n, max_size=n))
    seed = draw(st.integers(0, 2**32 - 1))
    return {"values": values, "weights": w, "dp": dp, "cp": cp, "micro": micro, "cells": cells,
            "seed": seed}


def partial_for(form: Form, xs: np.ndarray, ws: np.ndarray) -> dict[str, Any] | None:
    if form is Form.MEAN:
        return {"sum": float((xs * ws).sum()), "count": float(ws.sum())}
    if form is Form.SUM:
        return {"sum": float(xs.sum())}
    if form is Form.MIN:
        return {"min": float(xs.min())} if len(xs) else None
    if form is Form.MAX:
        return {"max": float(xs.max())} if len(xs) else None
    if form is Form.SQSUM:
        return {"sqsum": float((xs**2).sum())}
    if form is Form.MOMENTS:
        return {"count": float(len(xs)), "sum": float(xs.sum()), "sqsum": float((xs**2).sum())}
    raise AssertionError(form)


def reference(form: Form, xs: np.ndarray, ws: np.ndarray) -> tuple[float, float]:
    """The numpy value on the un-split data, and the magnitude scale for the tolerance."""
    if form is Form.MEAN:
        mean = float(np.average(xs, weights=ws)) if ws.sum() > 0 else math.nan
        return mean, float(np.abs(xs).max())
    if form is Form.SUM:
        return float(xs.sum()), float(np.abs(xs).sum())
    if form is Form.MIN:
        return float(xs.min()), 1.0
    if form is Form.MAX:
        return float(xs.max()), 1.0
    if form is Form.SQSUM:
        return float(np.linalg.norm(xs)), float(np.linalg.norm(xs))
    # population std: the sum-of-squares form loses digits when mean >> std, so the tolerance
    # scales with the magnitude of the data, not of the std.
    return float(np.std(xs)), float(np.abs(xs).max()) * 1e3


def split_reports(data: dict[str, Any], form: Form, name: str = "m") -> list[Report]:
    xs = np.asarray(data["values"], dtype=np.float64)
    ws = np.asarray(data["weights"], dtype=np.float64)
    cells = np.asarray(data["cells"])
    dp, cp, micro = data["dp"], data["cp"], data["micro"]
    world = {"dp": dp, "cp": cp}
    reports = []
    for d in range(dp):
        for c in range(cp):
            for m in range(micro):
                sel = cells == (d * cp + c) * micro + m
                partial = partial_for(form, xs[sel], ws[sel])
                metrics = {name: partial} if partial is not None else {}
                reports.append(parse_report({
                    "run": "r", "role": "actor", "step": 0, "rank": {"dp": d, "cp": c},
                    "world": world, "final": m == micro - 1, "seq": m, "metrics": metrics,
                }))
    return interleave(reports, data["seed"])


def interleave(reports: list[Report], seed: int) -> list[Report]:
    """A random arrival order across ranks that keeps each rank's own order (final record last,
    as the contract asks of a producer)."""
    queues: dict[Rank, list[Report]] = {}
    for report in reports:
        queues.setdefault(report.rank, []).append(report)
    rng = random.Random(seed)
    out = []
    while queues:
        rank = rng.choice(sorted(queues))
        out.append(queues[rank].pop(0))
        if not queues[rank]:
            del queues[rank]
    return out


def assemble(reports: list[Report]) -> dict[str, float]:
    asm = StepAssembler()
    out = None
    for report in reports:
        _, record = asm.add(report)
        if record is not None:
            out = record
    if out is None:
        (out,) = asm.finalize_all()
    return dict(out.metrics)


FORMS = [Form.MEAN, Form.SUM, Form.MIN, Form.MAX, Form.SQSUM, Form.MOMENTS]


@settings(max_examples=60, deadline=None, suppress_health_check=SLOW_OK)
@given(data=split_data(), form=st.sampled_from(FORMS))
def test_any_split_any_order_matches_numpy(data: dict[str, Any], form: Form) -> None:
    xs = np.asarray(data["values"])
    ws = np.asarray(data["weights"])
    got = assemble(split_reports(data, form)).get("m")
    if form is Form.MEAN and ws.sum() == 0:
        assert got is None  # a mean over zero tokens is absent, not zero
        return
    want, scale = reference(form, xs, ws)
    assert close(got, want, scale), (got, want)


@settings(max_examples=40, deadline=None, suppress_health_check=SLOW_OK)
@given(data=split_data(), form=st.sampled_from(FORMS), tree_seed=st.integers(0, 10_000))
def test_node_merge_tree_gives_the_same_value(data: dict[str, Any], form: Form, tree_seed: int) -> None:
    """Per-node mergers (each owns whole ranks, any grouping) pre-merge; the root merges their
    states; the result equals a flat merge."""
    reports = split_reports(data, form)
    flat = assemble(reports)
    rng = random.Random(tree_seed)
    node_of = {rank: rng.randrange(3) for rank in {r.rank for r in reports}}
    groups: dict[int, list[Report]] = {}
    for report in reports:
        groups.setdefault(node_of[report.rank], []).append(report)
    root = StepAssembler()
    record = None
    world = World(dp=data["dp"], cp=data["cp"])
    for members in groups.values():
        state = StepState("r", "actor", 0, world)
        for report in members:
            state.add(report.rank, report.minibatch, report.metrics)
            state.mark(report.rank, report.seq, report.final, report.time)
        record = root.merge_state(state)[1] or record
    if record is None:
        (record,) = root.finalize_all()
    assert set(record.metrics) == set(flat)
    _, scale = reference(form, np.asarray(data["values"]), np.asarray(data["weights"]))
    for key, value in flat.items():
        assert close(record.metrics[key], value, scale)


@settings(max_examples=80, deadline=None, suppress_health_check=SLOW_OK)
@given(
    form=st.sampled_from([*FORMS, Form.VALUE]),
    states=st.lists(st.tuples(finite, weights, weights), min_size=3, max_size=3),
)
def test_combine_is_associative_and_commutative(form: Form, states: list[tuple[float, ...]]) -> None:
    width = {Form.MEAN: 2, Form.MOMENTS: 3, Form.VALUE: 2}.get(form, 1)
    a, b, c = (s[:width] for s in states)
    if form is Form.VALUE:
        a, b, c = ((s[0], s[0]) for s in (a, b, c))
    left = combine(form, combine(form, a, b), c)
    right = combine(form, a, combine(form, b, c))
    swapped = combine(form, combine(form, c, a), b)
    for x, y, z in zip(left, right, swapped, strict=True):
        assert math.isclose(x, y, rel_tol=1e-12, abs_tol=1e-9)
        assert math.isclose(x, z, rel_tol=1e-12, abs_tol=1e-9)


@settings(max_examples=40, deadline=None, suppress_health_check=SLOW_OK)
@given(values=st.lists(finite, min_size=1, max_size=20), dp=st.integers(1, 4), cp=st.integers(2, 3),
       seed=st.integers(0, 1000))
def test_cp_replicas_counted_once(values: list[float], dp: int, cp: int, seed: int) -> None:
    """Per-sequence sums replicated over CP: every CP rank sends the same copy; counted once."""
    per_dp = [values[d::dp] for d in range(dp)]
    reports = [
        parse_report({
            "run": "r", "role": "actor", "step": 0, "rank": {"dp": d, "cp": c},
            "world": {"dp": dp, "cp": cp},
            "metrics": {"m": {"sum": float(sum(per_dp[d])), "count": float(len(per_dp[d])),
                              "replicated": ["cp"]}},
        })
        for d in range(dp) for c in range(cp)
    ]
    random.Random(seed).shuffle(reports)
    got = assemble(reports)["m"]
    assert close(got, float(np.mean(values)), max(abs(v) for v in values))


@settings(max_examples=40, deadline=None, suppress_health_check=SLOW_OK)
@given(
    minibatches=st.lists(st.lists(finite, min_size=1, max_size=8), min_size=1, max_size=4),
    dp=st.integers(1, 3), seed=st.integers(0, 1000),
)
def test_minibatch_mean_reduces_within_then_means(
    minibatches: list[list[float]], dp: int, seed: int
) -> None:
    """SkyRL loss semantics: sum within each mini-batch (micro-batches, DP ranks), mean over them."""
    reports = []
    for m, values in enumerate(minibatches):
        for d in range(dp):
            for u, chunk in enumerate((values[d::dp][::2], values[d::dp][1::2])):
                reports.append(parse_report({
                    "run": "r", "role": "actor", "step": 0, "rank": {"dp": d},
                    "world": {"dp": dp}, "minibatch": m, "seq": 2 * m + u,
                    "final": m == len(minibatches) - 1 and u == 1,
                    "metrics": {"loss": {"sum": float(sum(chunk)), "minibatch_reduce": "mean"}},
                }))
    reports = interleave(reports, seed)
    want = float(np.mean([np.sum(v) for v in minibatches]))
    scale = sum(abs(x) for v in minibatches for x in v)
    assert close(assemble(reports)["loss"], want, scale)


def test_nan_and_inf_propagate_whatever_the_order() -> None:
    for order in ([1.0, math.nan, 3.0], [math.nan, 1.0, 3.0], [1.0, 3.0, math.nan]):
        state: tuple[float, ...] = (order[0],)
        for v in order[1:]:
            state = combine(Form.MIN, state, (v,))
        assert math.isnan(state[0])
    p = Partial(Form.SUM, (math.inf,))
    assert combine(p.form, p.state, (1.0,)) == (math.inf,)


def test_empty_state_is_the_identity_of_sum_forms() -> None:
    zero = {Form.MEAN: (0.0, 0.0), Form.SUM: (0.0,), Form.SQSUM: (0.0,), Form.MOMENTS: (0.0, 0.0, 0.0)}
    for form, identity in zero.items():
        x = tuple(float(i + 1) for i in range(len(identity)))
        assert combine(form, identity, x) == x


def test_rank_identity_of_default_world() -> None:
    assert World().size == 1
    assert list(World(dp=2, cp=2).ranks())[-1] == Rank(1, 1, 0, 0)


@settings(max_examples=40, deadline=None, suppress_health_check=SLOW_OK)
@given(value=finite, dp=st.integers(1, 4), cp=st.integers(1, 3), seed=st.integers(0, 1000),
       nudge=st.sampled_from([0.0, 1e-9, 1e-3]))
def test_value_form_is_replicated_and_must_agree(
    value: float, dp: int, cp: int, seed: int, nudge: float
) -> None:
    """A {"value"} partial (an all-reduced grad norm, a learning rate) is the same on every rank:
    the result is that value whatever the layout and order; copies further apart than a relative
    1e-6 are a ReplicaMismatch."""
    copies = {(d, c): value for d in range(dp) for c in range(cp)}
    odd = (dp - 1, cp - 1)
    copies[odd] = value * (1 + nudge) + (nudge if value == 0 else 0.0)
    reports = [
        parse_report({"run": "r", "role": "actor", "step": 0, "rank": {"dp": d, "cp": c},
                      "world": {"dp": dp, "cp": cp}, "metrics": {"lr": {"value": v}}})
        for (d, c), v in copies.items()
    ]
    random.Random(seed).shuffle(reports)
    asm = StepAssembler()
    record = None
    for report in reports:
        record = asm.add(report)[1] or record
    assert record is not None
    other = copies[odd]
    disagree = dp * cp > 1 and other != value and not math.isclose(other, value, rel_tol=1e-6)
    assert record.replica_mismatches == (("lr",) if disagree else ())
    assert record.metrics["lr"] == copies[(0, 0)]  # one copy counted: the lowest rank's
