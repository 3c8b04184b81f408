"""Step timelines: spans recorded by the Reporter, checked like every field of a message, kept
per rank through the assembler, the node-merge tier and the aggregator's outbox, and the
straggler found from them."""

from __future__ import annotations

import time
import types
from dataclasses import replace

import pytest

from rlmon.actors.reporter import Reporter
from rlmon.actors.reporter import facade as reporter_module
from rlmon.actors.reporter import packer as packer_module
from rlmon.actors.reporter.sink import LocalSink
from rlmon.service.aggregation.assembly import StepAssembler
from rlmon.service.aggregation.node_merge import NodeMerger
from rlmon.service.aggregation.tier_messages import NodeBatch
from rlmon.service.aggregation.watermark import decode_record, encode_record
from rlmon.service.contract.records import ContractError
from rlmon.service.contract.step_message import StepMessage
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.contract.timeline import (
    MAX_SPANS,
    RankTimeline,
    Span,
    Timeline,
    find_straggler,
)
from rlmon.service.metrics.rank import Rank, World
from rlmon.service.storage.history import HistoryStore
from tests.support.records import step_record

S = 1_000_000_000  # ns per second


def _message(rank: Rank, timeline: object, world: World | None = None) -> StepMessage:
    return StepMessage("r", "actor", 0, rank, world or World(dp=2), 1, 1.0,
                       timeline=timeline)  # type: ignore[arg-type]


def _timeline(seconds: float, spans: tuple[Span, ...] = (), start: int = 10 * S) -> Timeline:
    return Timeline(start, start + int(seconds * S), spans, host="node-a", pid=7)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The Reporter's clocks, driven by the test (monotonic ns)."""
    now = [0]
    fake = types.SimpleNamespace(
        perf_counter_ns=lambda: now[0], perf_counter=lambda: now[0] / S, time=time.time,
        time_ns=time.time_ns, monotonic=time.monotonic)
    monkeypatch.setattr(reporter_module, "time", fake)
    return now


def test_reporter_ships_nested_spans_with_attributes_in_the_step_message(
    clock: list[int],
) -> None:
    sent: list[StepMessage] = []

    class Capture:
        def send(self, messages: list[StepMessage]) -> None:
            sent.extend(messages)

    rep = Reporter("r", "actor", rank={"dp": 0}, world={"dp": 1}, sink=Capture())  # type: ignore[arg-type]
    clock[0] = 1 * S
    with rep.span("generate", engine="vllm", batch=8):
        clock[0] += 2 * S
    with rep.span("train"):
        clock[0] += S
        with rep.span("backward", micro_batch=0, frac=0.5, ok=True, obj=object()):
            clock[0] += S
    clock[0] += S
    rep.end_step(0)
    assert rep.flush(5)
    rep.close()
    (msg,) = sent
    tl = msg.timeline
    assert tl is not None
    offset = packer_module._WALL_OFFSET_NS
    assert (tl.start_ns - offset, tl.end_ns - offset) == (0, 6 * S)  # the whole step
    assert [(s.name, s.start_ns - offset, s.end_ns - offset, s.depth) for s in tl.spans] == [
        ("generate", 1 * S, 3 * S, 0), ("backward", 4 * S, 5 * S, 1), ("train", 3 * S, 5 * S, 0)]
    assert tl.spans[0].attrs == (("engine", "vllm"), ("batch", 8))
    attrs = dict(tl.spans[1].attrs)
    assert attrs["micro_batch"] == 0 and attrs["frac"] == 0.5 and attrs["ok"] is True
    assert isinstance(attrs["obj"], str) and attrs["obj"].startswith("<object")  # shown as text
    assert tl.cut == 0 and tl.pid > 0 and tl.host


def test_spans_beyond_the_bound_are_cut_and_counted(clock: list[int]) -> None:
    sink = LocalSink()
    rep = Reporter("r", "actor", rank={"dp": 0}, world={"dp": 1}, sink=sink)
    for _ in range(MAX_SPANS + 5):
        with rep.span("decode"):
            clock[0] += 1000
    rep.end_step(0)
    assert rep.flush(5)
    rep.close()
    (rec,) = sink.records
    (kept,) = rec.timelines
    assert len(kept.timeline.spans) == MAX_SPANS
    assert kept.timeline.cut == 5 and rec.timelines_cut == 5
    assert rec.metrics["timing/decode_seconds"] == pytest.approx(1e-6)  # every span timed


@pytest.mark.parametrize(("timeline", "field"), [
    ("spans", "timeline"),
    (Timeline(5, 4), "timeline.end_ns"),
    (Timeline(1.5, 4), "timeline.start_ns"),  # type: ignore[arg-type]
    (Timeline(0, 4, [Span("a", 0, 1)]), "timeline.spans"),  # type: ignore[arg-type]
    (Timeline(0, 4, (Span("a", 3, 1),)), "timeline.spans[0].end_ns"),
    (Timeline(0, 4, (Span("", 0, 1),)), "timeline.spans[0].name"),
    (Timeline(0, 4, (Span("a\n", 0, 1),)), "timeline.spans[0].name"),
    (Timeline(0, 4, (Span("a", 0, 1, depth=-1),)), "timeline.spans[0].depth"),
    (Timeline(0, 4, (Span("a", 0, 1, attrs=(("k", [1]),)),)), "timeline.spans[0].attrs.k"),
    (Timeline(0, 4, (Span("a", 0, 1, attrs=(("k", float("nan")),)),)),
     "timeline.spans[0].attrs.k"),
    (Timeline(0, 4, (Span("a", 0, 1),) * (MAX_SPANS + 1)), "timeline.spans"),
    (Timeline(0, 4, cut=-1), "timeline.cut"),
    (Timeline(0, 4, host=None), "timeline.host"),  # type: ignore[arg-type]
])
def test_a_bad_timeline_is_rejected_naming_the_field(timeline: object, field: str) -> None:
    assembler = StepAssembler()
    with pytest.raises(ContractError) as err:
        assembler.add_message(_message(Rank(), timeline))
    assert err.value.field == field
    assert assembler.counters.rejected == 1
    assert not assembler.open  # nothing of it was kept


def test_timelines_stay_per_rank_through_the_node_merge_tier_and_the_outbox() -> None:
    """Direct and through two node mergers, the record holds each rank's own timeline; encoded
    for the aggregator's outbox and decoded, it still does (and names the same straggler)."""
    world = World(dp=4)
    msgs = [_message(Rank(dp=d), _timeline(5.0, (Span("gen", 10 * S, (11 + 3 * (d == 2)) * S),)),
                     world) for d in range(4)]
    direct = StepAssembler()
    for msg in msgs:
        _, rec = direct.add_message(msg)
    assert rec is not None
    nodes = [NodeMerger(), NodeMerger()]
    for msg in msgs:
        nodes[msg.rank.dp % 2].add(msg)
    root = StepAssembler()
    for node in nodes:
        batch = node.next_batch()
        assert isinstance(batch, NodeBatch)
        for state in batch.states:
            _, merged = root.merge_state(state)
    assert merged is not None
    want = {t.rank: t.timeline for t in rec.timelines}
    assert {t.rank: t.timeline for t in merged.timelines} == want == {
        m.rank: m.timeline for m in msgs}
    assert merged.straggler == rec.straggler
    assert rec.straggler is not None and rec.straggler.rank == Rank(dp=2)
    again = decode_record(encode_record(rec))
    assert again.timelines == rec.timelines and again.straggler == rec.straggler


def test_a_node_states_bad_timeline_is_rejected() -> None:
    node = NodeMerger()
    node.add(_message(Rank(dp=0), _timeline(1.0)))
    (state,) = node.drain()
    state.timelines[Rank(dp=0)] = replace(state.timelines[Rank(dp=0)], end_ns=0)
    root = StepAssembler()
    with pytest.raises(ContractError, match=r"timeline\.end_ns"):
        root.merge_state(state)
    assert root.counters.rejected == 1


def test_find_straggler_names_the_rank_and_the_deepest_span_behind_it() -> None:
    def rank(d: int, backward: float) -> RankTimeline:
        spans = (Span("gen", 0, 1 * S), Span("backward", 2 * S, int((2 + backward) * S), 1),
                 Span("train", 1 * S, int((2.5 + backward) * S)))
        return RankTimeline(Rank(dp=d), Timeline(0, int((3 + backward) * S), spans))

    found = find_straggler([rank(0, 1.0), rank(1, 1.0), rank(2, 4.0), rank(3, 1.1)])
    assert found is not None
    assert found.rank == Rank(dp=2)
    assert found.ratio == pytest.approx(6.5 / 3.55)  # busy: gen + train (backward inside)
    assert found.span == "backward"  # as slow as "train" around it, and deeper
    assert found.span_excess == pytest.approx(4.0 - 1.05)
    assert "dp=2" in found.describe() and "'backward'" in found.describe()
    assert find_straggler([rank(0, 1.0)]) is None
    even = find_straggler([rank(0, 1.0), rank(1, 1.0)])
    assert even is not None and even.ratio == 1.0 and even.span == ""


def _record(step: int, role: str = "actor", attempt: int = 0) -> StepRecord:
    timelines = tuple(RankTimeline(Rank(dp=d), _timeline(1.0 + d, (Span("gen", 10 * S, 11 * S),),
                                                         start=(10 + step) * S))
                      for d in range(2))
    return step_record(role=role, step=step, ranks_expected=2, finalized_at=100.0 + step,
                       attempt=attempt, timelines=timelines, timelines_cut=step)


def test_history_keeps_timelines_beside_steps_with_their_own_retention() -> None:
    store = HistoryStore()
    store.add([_record(s) for s in range(10)] + [_record(0, "critic")])
    got = store.timelines("r", "actor", 3, 5)
    assert [(t.step, t.cut) for t in got] == [(3, 3), (4, 4), (5, 5)]
    assert got[0].ranks == _record(3).timelines  # every rank's own, as sent
    assert [t.role for t in store.timelines("r")] == ["actor"] * 10 + ["critic"]
    store.add([_record(0, attempt=1)])  # a rerun: its timelines replace the old attempt's view
    assert [(t.step, t.attempt) for t in store.timelines("r", "actor")] == [(0, 1)]
    pruned = store.prune(keep_steps=100, keep_timelines=4)
    assert pruned.timelines == 7  # actor keeps 4 of 11, critic its one
    assert pruned.steps == 0  # the steps themselves stay
    assert [t.step for t in store.timelines("r", "actor")] == [0]  # attempt 1's step 0
    store.add([_record(11)])
    # the run, whole: actor's 4 kept and its new one, critic's one
    assert store.prune(keep_steps=100, quiet_before=1e9).timelines == 6
    assert store.timelines("r") == []
