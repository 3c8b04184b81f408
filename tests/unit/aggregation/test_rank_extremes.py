"""The per-rank extremes a step keeps for every metric (the page's band across ranks): the lowest
and highest rank's own value, each rank's statistic over its own data alone (a token-weighted
mean, a sum, a norm; a mini-batch mean's mean over its mini-batches), replicas counted once,
checked against numpy on the un-split data, whatever path the partials took: contract records
split into micro-batches, one step message per rank (the columnar block), node mergers in front
of the root, and the aggregator's durable outbox across a restart."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from rlmon.service.aggregation.aggregator import AggregatorCore
from rlmon.service.aggregation.assembly import StepAssembler
from rlmon.service.aggregation.block import own_values
from rlmon.service.aggregation.node_merge import NodeMerger
from rlmon.service.aggregation.tier_messages import NodeBatch
from rlmon.service.aggregation.watermark import WatermarkStore
from rlmon.service.contract.records import parse_line
from rlmon.service.contract.step_message import StepMessage, columns_from_states
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.metrics.forms import FORMS
from rlmon.service.metrics.partial import ALL_AXES, Partial
from rlmon.service.metrics.rank import Rank, World
from rlmon.service.metrics.spec import Form

WORLD = World(dp=4, cp=2, tp=2)
STEPS = 3


def _data(seed: int) -> dict[int, dict[Rank, dict[str, np.ndarray]]]:
    """Per step and rank, the rank's raw numbers: ``kl`` per token (rank-own, one rank of step 1
    with no token), ``reward`` per sample (the same on the two TP ranks of a (dp, cp): a copy),
    ``mb0``/``mb1`` the tokens of two mini-batches, ``grad`` a gradient shard's entries."""
    rng = np.random.default_rng(seed)
    out: dict[int, dict[Rank, dict[str, np.ndarray]]] = {}
    for step in range(STEPS):
        shared = {(dp, cp): rng.normal(1.0, 0.5, rng.integers(3, 9))
                  for dp in range(4) for cp in range(2)}
        ranks = {}
        for rank in WORLD.ranks():
            tokens = 0 if (step, rank) == (1, Rank(dp=2, cp=1, tp=0)) else rng.integers(5, 40)
            ranks[rank] = {
                "kl": rng.gamma(2.0, 0.01 * (1 + rank.dp), tokens),
                # a TP copy; one disagrees (step 0, dp 3, cp 1): the lowest rank's copy counts
                "reward": shared[(rank.dp, rank.cp)] * (
                    10.0 if (step, rank) == (0, Rank(dp=3, cp=1, tp=1)) else 1.0),
                "mb0": rng.normal(-1.0 * rank.cp, 1.0, rng.integers(1, 20)),
                "mb1": rng.normal(0.5 * rank.dp, 1.0, rng.integers(1, 20)),
                "grad": rng.normal(0.0, 1.0 + rank.tp, 16),
            }
        out[step] = ranks
    return out


def _reference(data: dict[Rank, dict[str, np.ndarray]]) -> dict[str, tuple[float, float]]:
    """numpy's extremes of each rank's own value over the un-split data."""
    kl = [float(np.mean(d["kl"])) for d in data.values() if len(d["kl"])]
    tokens = [float(np.sum(d["kl"])) for d in data.values()]
    # one copy per (dp, cp): the TP ranks hold the same
    reward = [float(np.mean(data[Rank(dp=dp, cp=cp)]["reward"]))
              for dp in range(4) for cp in range(2)]
    mb = [(float(np.mean(d["mb0"])) + float(np.mean(d["mb1"]))) / 2 for d in data.values()]
    norm = [float(np.sqrt(np.sum(d["grad"] ** 2))) for d in data.values()]
    return {name: (min(v), max(v)) for name, v in (
        ("actor/kl", kl), ("user/kl_sum", tokens), ("rollout/reward", reward),
        ("user/mb_loss", mb), ("user/grad_norm_shard", norm))}


def _lines(step: int, rank: Rank, d: dict[str, np.ndarray]) -> list[str]:
    """The rank's records of the step as a training loop would send them: one per micro-batch
    of four tokens (``final`` false until the last), each with its part of every sum."""
    kl, grad = d["kl"], d["grad"]
    parts = max(1, math.ceil(len(kl) / 4))
    lines = []
    for i in range(parts):
        chunk = kl[4 * i:4 * i + 4]
        metrics: dict[str, object] = {
            "actor/kl": {"sum": float(np.sum(chunk)), "count": len(chunk)},
            "user/kl_sum": {"sum": float(np.sum(chunk))},
            "user/grad_norm_shard": {"sqsum": float(np.sum(grad[i::parts] ** 2))},
        }
        if i == 0:
            metrics["rollout/reward"] = {"sum": float(np.sum(d["reward"])),
                                         "count": len(d["reward"]), "replicated": ["tp"]}
            metrics["actor/lr"] = {"value": 1e-6}
        lines.append(json.dumps({
            "run": "r", "role": "actor", "step": step, "rank": rank.as_dict(),
            "world": WORLD.as_dict(), "final": False, "seq": i, "metrics": metrics}))
    for mb in (0, 1):
        values = d[f"mb{mb}"]
        lines.append(json.dumps({
            "run": "r", "role": "actor", "step": step, "rank": rank.as_dict(),
            "world": WORLD.as_dict(), "final": mb == 1, "seq": 100 + mb, "minibatch": mb,
            "metrics": {"user/mb_loss": {"sum": float(np.sum(values)), "count": len(values),
                                         "minibatch_reduce": "mean"}}}))
    return lines


def _message(step: int, rank: Rank, d: dict[str, np.ndarray], seq: int) -> StepMessage:
    """The rank's step as one message: its plain sums in the columnar block, the rest as
    partials (what the Reporter packs)."""
    kl = d["kl"]
    columns = columns_from_states({
        "actor/kl": (Form.MEAN, (float(np.sum(kl)), float(len(kl)))),
        "user/kl_sum": (Form.SUM, (float(np.sum(kl)),)),
        "user/grad_norm_shard": (Form.SQSUM, (float(np.sum(d["grad"] ** 2)),)),
    })
    partials = {
        "rollout/reward": Partial(Form.MEAN, (float(np.sum(d["reward"])),
                                              float(len(d["reward"]))), frozenset({"tp"})),
        "actor/lr": Partial(Form.VALUE, (1e-6, 1e-6), ALL_AXES),
    }
    mbs = tuple((mb, {"user/mb_loss": Partial(
        Form.MEAN, (float(np.sum(d[f"mb{mb}"])), float(len(d[f"mb{mb}"]))), None, True)})
        for mb in (0, 1))
    return StepMessage("r", "actor", step, rank, WORLD, seq, 0.0, columns,
                       ((0, partials), *mbs))


def _check(records: list[StepRecord], data: dict[int, dict[Rank, dict[str, np.ndarray]]],
           ) -> None:
    assert sorted(r.step for r in records) == sorted(data)
    for record in records:
        want = _reference(data[record.step])
        got = dict(record.rank_extremes)
        assert set(got) == set(want), record.step  # a value (the learning rate) has no spread
        for name, (lo, hi) in want.items():
            assert got[name] == (pytest.approx(lo, rel=1e-12), pytest.approx(hi, rel=1e-12)), (
                record.step, name)
        assert ("rollout/reward" in record.replica_mismatches) == (record.step == 0)
        # the step's value lies between its ranks' extremes (a token-weighted mean of them)
        lo, hi = got["actor/kl"]
        assert lo <= record.metrics["actor/kl"] <= hi


@pytest.mark.parametrize("seed", range(3))
def test_contract_records_split_into_micro_batches(seed: int) -> None:
    data = _data(seed)
    asm = StepAssembler()
    records = []
    for step, ranks in data.items():
        for rank, d in reversed(list(ranks.items())):  # any order
            for line in _lines(step, rank, d):
                _, record = asm.add(parse_line(line))
                records += [record] if record else []
    _check(records, data)


@pytest.mark.parametrize("seed", range(3))
def test_step_messages_and_node_mergers(seed: int) -> None:
    data = _data(seed)
    messages = [_message(step, rank, d, seq=step * 100 + i)
                for step, ranks in data.items() for i, (rank, d) in enumerate(ranks.items())]
    direct = StepAssembler()
    records = [r for m in messages if (r := direct.add_message(m)[1]) is not None]
    _check(records, data)
    # two node mergers, each pre-merging the ranks of its node, in front of the root
    nodes = [NodeMerger(), NodeMerger()]
    for m in messages:
        nodes[m.rank.dp % 2].add(m)
    root = AggregatorCore()
    for node in nodes:
        root.merge_batch(NodeBatch(node.drain()))
    _check(root.pending_records(), data)


def test_the_extremes_survive_the_aggregators_outbox_across_a_restart(tmp_path: Path) -> None:
    data = _data(7)
    data[2][Rank(dp=1)]["kl"][0] = math.nan  # a NaN on one rank: its extremes say so
    messages = [_message(step, rank, d, seq=step * 100 + i)
                for step, ranks in data.items() for i, (rank, d) in enumerate(ranks.items())]
    core = AggregatorCore(store=WatermarkStore(tmp_path / "watermark.sqlite"))
    core.ingest(messages)
    before = {r.step: r.rank_extremes for r in core.pending_records()}
    core.store.close()  # type: ignore[union-attr]
    again = AggregatorCore(store=WatermarkStore(tmp_path / "watermark.sqlite"))
    after = {r.step: r.rank_extremes for r in again.pending_records()}
    for name in ("actor/kl", "user/kl_sum"):  # the NaN rank's metrics
        assert all(math.isnan(v) for v in (*after[2].pop(name), *before[2].pop(name)))
    assert after == before
    _check([r for r in again.pending_records() if r.step < 2], {s: data[s] for s in (0, 1)})


def test_one_rank_or_one_copy_has_no_spread() -> None:
    asm = StepAssembler()
    _, record = asm.add(parse_line(json.dumps({
        "run": "r", "role": "actor", "step": 0, "world": {"dp": 1, "tp": 2}, "rank": {"tp": 0},
        "metrics": {"actor/kl": {"sum": 1.0, "count": 2}}})))
    assert record is None
    _, record = asm.add(parse_line(json.dumps({
        "run": "r", "role": "actor", "step": 0, "world": {"dp": 1, "tp": 2}, "rank": {"tp": 1},
        "metrics": {"rollout/reward": {"sum": 1.0, "count": 2, "replicated": "all"}}})))
    assert record is not None and record.metrics["actor/kl"] == 0.5
    assert record.rank_extremes == {}  # one rank's value, one copy of a replicated metric


def test_a_block_row_finalizes_as_its_form_does() -> None:
    """The block's vectorized finalization (:func:`own_values`) against the forms' own, on
    every columnar form with edge cases (zero counts, NaN, Inf, a negative sqsum)."""
    cases = {
        Form.MEAN: [(3.0, 2.0), (0.0, 0.0), (math.inf, 0.0), (math.nan, 1.0), (-1.5, 3.0)],
        Form.SUM: [(2.5,), (math.nan,)],
        Form.MIN: [(-1.0,), (math.inf,)],
        Form.MAX: [(4.0,), (-math.inf,)],
        Form.SQSUM: [(9.0,), (-1.0,), (math.inf,)],
        Form.MOMENTS: [(4.0, 2.0, 3.0), (0.0, 0.0, 0.0), (0.0, math.nan, 0.0), (2.0, 1.0, 0.5)],
    }
    for i in range(max(len(c) for c in cases.values())):
        states = {f"m/{form.value}": (form, c[i % len(c)]) for form, c in cases.items()}
        cols = columns_from_states(states)
        values, defined = own_values(cols.schema, cols.values)
        for name, form, value, ok in zip(cols.schema.names, cols.schema.forms, values.tolist(),
                                         defined.tolist(), strict=True):
            want = FORMS[form].finalize(states[name][1])
            if want is None:
                assert not ok, name
            else:
                assert ok and (value == want or (math.isnan(value) and math.isnan(want))), (
                    name, states[name], value, want)
