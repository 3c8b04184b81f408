"""The ranked forms (top-k / bottom-k items): any split over ranks and micro-batches, any merge
order, through the parser or the node-merge tier, gives the global top-k of the un-split items."""

from __future__ import annotations

import json
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlmon.service.aggregation.aggregator import AggregatorCore
from rlmon.service.aggregation.assembly import StepAssembler
from rlmon.service.aggregation.node_merge import NodeMerger
from rlmon.service.aggregation.tier_messages import NodeBatch
from rlmon.service.contract.records import ContractError, parse_line
from rlmon.service.contract.step_message import StepMessage
from rlmon.service.metrics.partial import Partial
from rlmon.service.metrics.rank import Rank, World
from rlmon.service.metrics.ranked_forms import MAX_PAYLOAD_BYTES, Sample, json_score
from rlmon.service.metrics.spec import Form

_SCORE = st.floats(-1e6, 1e6, allow_nan=False) | st.just(math.nan) | st.just(math.inf)
_ITEM = st.tuples(_SCORE, st.sampled_from([f"s{i}" for i in range(30)]), st.text(max_size=5))


def _truth(items: list[Sample], k: int, highest: bool) -> list[Sample]:
    """The reference: best copy per id, NaN first, then by score, ties by id then payload;
    the first k."""
    def order(item: Sample) -> tuple[int, float, str, str]:
        if item[0] != item[0]:
            return (0, 0.0, item[1], item[2])
        return (1, -item[0] if highest else item[0], item[1], item[2])

    best: dict[str, Sample] = {}
    for item in items:
        if item[1] not in best or order(item) < order(best[item[1]]):
            best[item[1]] = item
    return sorted(best.values(), key=order)[:k]


def _same(a: list[Sample], b: list[Sample]) -> bool:
    return len(a) == len(b) and all(
        (x[0] == y[0] or (x[0] != x[0] and y[0] != y[0])) and x[1:] == y[1:]
        for x, y in zip(a, b, strict=True))


def _line(items: list[Sample], k: int, key: str, dp: int, world: int, mb: int, final: bool,
          ) -> str:
    return json.dumps({
        "run": "r", "role": "actor", "step": 0, "rank": {"dp": dp}, "world": {"dp": world},
        "minibatch": mb, "final": final,
        "metrics": {"samples/worst": {"k": k, key: [[json_score(s), i, p] for s, i, p in items]}},
    })


@settings(max_examples=150, deadline=None)
@given(items=st.lists(_ITEM, min_size=1, max_size=60), k=st.integers(1, 8),
       ranks=st.integers(1, 4), micro=st.integers(1, 3), highest=st.booleans(),
       seed=st.integers(0, 10_000))
def test_any_split_and_order_gives_the_global_top_k(
        items: list[Sample], k: int, ranks: int, micro: int, highest: bool, seed: int) -> None:
    rng = random.Random(seed)
    key = "top" if highest else "bottom"
    cells: dict[tuple[int, int], list[Sample]] = {}
    for item in items:
        cells.setdefault((rng.randrange(ranks), rng.randrange(micro)), []).append(item)
    lines = []
    for dp in range(ranks):
        for mb in range(micro):
            local = _truth(cells.get((dp, mb), []), k, highest)  # what a producer keeps
            lines.append(_line(local, k, key, dp, ranks, mb, final=mb == micro - 1))
    finals = [ln for ln in lines if json.loads(ln)["final"]]
    others = [ln for ln in lines if not json.loads(ln)["final"]]
    rng.shuffle(others)
    asm = StepAssembler()
    records = [asm.add(parse_line(line))[1] for line in others + finals]
    (record,) = [r for r in records if r is not None]
    want = _truth(items, k, highest)
    assert _same(list(record.samples["samples/worst"]), want)
    got = record.metrics["samples/worst"]
    assert got == want[0][0] or (math.isnan(got) and math.isnan(want[0][0]))


@settings(max_examples=60, deadline=None)
@given(items=st.lists(_ITEM, min_size=1, max_size=40), k=st.integers(1, 6),
       seed=st.integers(0, 10_000))
def test_the_node_merge_tier_gives_the_same_top_k(items: list[Sample], k: int, seed: int) -> None:
    rng = random.Random(seed)
    world = World(dp=4)
    per_rank: dict[int, list[Sample]] = {dp: [] for dp in range(4)}
    for item in items:
        per_rank[rng.randrange(4)].append(item)
    nodes = [NodeMerger(), NodeMerger()]
    for dp, mine in per_rank.items():
        local = _truth(mine, k, True)
        partial = Partial(Form.TOP, (k, *local))
        msg = StepMessage("r", "actor", 0, Rank(dp=dp), world, 1, 0.0, None,
                          ((0, {"samples/worst": partial}),))
        nodes[dp % 2].add(msg)
    root = AggregatorCore()
    for node in nodes:
        root.merge_batch(NodeBatch(node.drain()))
    (record,) = root.pending_records()
    assert _same(list(record.samples["samples/worst"]), _truth(items, k, True))


@pytest.mark.parametrize(("metric", "field"), [
    ({"k": 0, "top": []}, "metrics.m.k"),
    ({"k": 65, "top": []}, "metrics.m.k"),
    ({"k": 2, "top": [[1.0, "a"], [2.0, "a"]]}, "metrics.m.top.1.id"),
    ({"k": 1, "top": [[1.0, "a"], [2.0, "b"]]}, "metrics.m.top"),
    ({"k": 1, "top": [["x", "a"]]}, "metrics.m.top.0.score"),
    ({"k": 1, "top": [[1.0, "a", "x" * (MAX_PAYLOAD_BYTES + 1)]]}, "metrics.m.top.0.payload"),
    ({"k": 1, "top": [[1.0, ""]]}, "metrics.m.top.0.id"),
    ({"k": 1, "top": [[1.0, "a"]], "replicated": "all"}, "metrics.m.replicated"),
    ({"k": 1, "top": "a"}, "metrics.m.top"),
])
def test_bad_ranked_partials_are_rejected_naming_the_field(metric: dict[str, object],
                                                           field: str) -> None:
    line = json.dumps({"run": "r", "role": "actor", "step": 0, "metrics": {"m": metric}})
    with pytest.raises(ContractError) as caught:
        parse_line(line)
    assert caught.value.field == field, str(caught.value)


def test_a_ranked_metric_keeps_one_form_and_never_travels_in_the_block() -> None:
    from rlmon.service.metrics.forms import FORMS

    assert FORMS[Form.TOP].columnar is None and FORMS[Form.BOTTOM].columnar is None
    asm = StepAssembler()
    asm.add(parse_line(_line([(1.0, "a", "")], 1, "top", 0, 2, 0, True)))
    with pytest.raises(ContractError, match="form"):
        asm.add(parse_line(_line([(1.0, "a", "")], 1, "bottom", 1, 2, 0, True)))
