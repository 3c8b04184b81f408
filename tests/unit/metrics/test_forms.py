"""The form table is the one definition: parser, Reporter, block and merge all follow it."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlmon.actors.reporter import Reporter
from rlmon.actors.reporter.sink import LocalSink
from rlmon.service.aggregation.aggregator import AggregatorCore
from rlmon.service.aggregation.assembly import StepAssembler
from rlmon.service.aggregation.node_merge import NodeMerger
from rlmon.service.contract.acks import AddOutcome
from rlmon.service.contract.records import ContractError, parse_line
from rlmon.service.contract.step_message import StepMessage, columns_from_states, state_row
from rlmon.service.metrics.forms import FORMS, Merge, form_of_keys
from rlmon.service.metrics.partial import combine
from rlmon.service.metrics.rank import Rank, World
from rlmon.service.metrics.spec import Form

_NUMBER = st.floats(-1e6, 1e6, allow_nan=False)
_COUNT = st.floats(0, 1e6, allow_nan=False)


def _state(form: Form, draw_numbers: list[float]) -> tuple[Any, ...]:
    spec = FORMS[form]
    if spec.ranked is not None:  # k, then items (score, id, payload) best first
        items = [(v, f"id{i}", "") for i, v in enumerate(draw_numbers)]
        return spec.ranked.check((len(items), *items))
    values = list(draw_numbers[: spec.size])
    for i in (*spec.counts, *spec.nonnegative):
        values[i] = abs(values[i])
    if spec.agree:
        values = [values[0]] * spec.size
    return tuple(values)


@pytest.mark.parametrize("form", list(FORMS))
def test_every_form_is_recognised_by_its_keys_and_parses_back(form: Form) -> None:
    spec = FORMS[form]
    assert form_of_keys(spec.key_set) is form
    state = _state(form, [3.0, 2.0, 5.0])
    line = json.dumps({"run": "r", "role": "actor", "step": 0,
                       "metrics": {"m": spec.as_keys(state)}})
    assert parse_line(line).metrics["m"].state == state


@pytest.mark.parametrize("form", [f for f, d in FORMS.items() if d.counts or d.nonnegative])
def test_domain_slots_are_checked_by_the_table(form: Form) -> None:
    spec = FORMS[form]
    slot = (*spec.counts, *spec.nonnegative)[0]
    state = list(_state(form, [1.0, 1.0, 1.0]))
    state[slot] = -1.0
    line = json.dumps({"run": "r", "role": "actor", "step": 0,
                       "metrics": {"m": dict(zip(spec.keys, state, strict=True))}})
    with pytest.raises(ContractError, match=f"metrics.m.{spec.keys[slot]}"):
        parse_line(line)


@pytest.mark.parametrize("form", [f for f, d in FORMS.items() if d.ranked is None])
def test_the_reporter_records_each_form_by_its_keys(form: Form) -> None:
    spec = FORMS[form]
    sink = LocalSink()
    rep = Reporter("r", "actor", sink=sink, step_seconds=False)
    state = _state(form, [3.0, 2.0, 5.0])
    rep.record("custom/m", **spec.as_keys(state))  # type: ignore[arg-type]
    rep.end_step(0)
    assert rep.flush(10)
    rep.close()
    (record,) = sink.records
    assert record.metrics["custom/m"] == pytest.approx(spec.finalize(state))


@settings(max_examples=60, deadline=None)
@given(form=st.sampled_from([f for f, d in FORMS.items() if d.columnar is not None]),
       numbers=st.lists(st.lists(_NUMBER, min_size=3, max_size=3), min_size=2, max_size=6))
def test_block_and_scalar_merge_agree_bit_for_bit_for_every_columnar_form(
        form: Form, numbers: list[list[float]]) -> None:
    """The numpy block merges each form the way the table says the scalar merge does."""
    states = [_state(form, n) for n in numbers]
    world = World(dp=len(states))
    asm = StepAssembler()
    record = None
    for i, state in enumerate(states):
        msg = StepMessage("r", "actor", 0, Rank(dp=i), world, i + 1, 0.0,
                          columns_from_states({"custom/m": (form, state)}))
        _, record = asm.add_message(msg)
    assert record is not None
    merged = states[0]
    for state in states[1:]:
        merged = combine(form, merged, state)
    want = FORMS[form].finalize(merged)
    got = record.metrics.get("custom/m")
    assert got == want or (got is not None and want is not None and math.isnan(got)
                           and math.isnan(want))


def test_block_rows_are_states_padded_by_the_table() -> None:
    for form, spec in FORMS.items():
        if spec.columnar is None:
            continue
        row = state_row(form, _state(form, [1.0, 2.0, 3.0]))
        assert len(row) == 3 and row[spec.size:] == (0.0,) * (3 - spec.size)
    assert {d.columnar for d in FORMS.values()} == {Merge.ADD, Merge.MIN, Merge.MAX, None}


def _msg(dp: int, seq: int, loss: float) -> StepMessage:
    cols = columns_from_states({"actor/loss": (Form.MEAN, (loss, 1.0))})
    return StepMessage("r", "actor", 0, Rank(dp=dp), World(dp=2), seq, 0.0, cols)


def test_a_node_state_repeating_a_rank_the_root_holds_is_a_duplicate_not_merged_twice() -> None:
    """A node merger that restarted cannot tell a resend: the root must (its rank's final record
    already arrived in an earlier batch)."""
    root = AggregatorCore()
    first = NodeMerger()
    first.add(_msg(0, 1, 4.0))
    batch = first.next_batch()
    assert batch is not None
    assert root.merge_batch(batch).accepted == 1
    restarted = NodeMerger()  # lost what it had seen: takes the resend again
    restarted.add(_msg(0, 1, 4.0))
    again = restarted.next_batch()
    assert again is not None
    ack = root.merge_batch(again)
    assert (ack.accepted, ack.duplicates) == (0, 1)
    assert root.counters.duplicates == 1
    root.ingest([_msg(1, 1, 2.0)])
    (record,) = root.pending_records()
    assert record.complete and record.metrics["actor/loss"] == 3.0  # not (4 + 4 + 2) / 3


def test_node_merger_refusals_reach_the_root_once() -> None:
    root, node = AggregatorCore(), NodeMerger()
    node.add(_msg(0, 1, 1.0))
    assert not node.add(_msg(0, 1, 1.0))  # a resend the node merger recognises
    bad = StepMessage("r", "actor", 0, Rank(dp=1), World(dp=2), 2, 0.0,
                      columns_from_states({"actor/loss": (Form.MAX, (1.0,))}))
    node.add(_msg(1, 2, 1.0))
    with pytest.raises(ContractError):
        node.add(bad)  # options differ from the step's earlier records
    batch = node.next_batch()
    assert batch is not None and (batch.rejected, batch.duplicates) == (1, 1)
    root.merge_batch(batch)
    root.merge_batch(batch)  # a retry counts nothing twice
    assert (root.counters.rejected, root.counters.duplicates) == (1, 1)
    assert node.next_batch() is None  # nothing new to say


def test_one_assembler_takes_reports_messages_and_states() -> None:
    asm = StepAssembler()
    assert asm.add_message(_msg(0, 1, 1.0))[0] == AddOutcome.ACCEPTED
    assert asm.add_message(_msg(0, 1, 1.0))[0] == AddOutcome.DUPLICATE
    assert asm.counters.accepted == 1 and asm.counters.duplicates == 1
    with pytest.raises(ContractError):
        asm.add_message(StepMessage("r", "actor", 0, Rank(dp=1), World(dp=3), 2, 0.0))
    assert asm.counters.rejected == 1
    merger = NodeMerger()
    merger.add(_msg(1, 1, 3.0))
    (state,) = merger.drain()
    outcome, record = asm.merge_state(state)
    assert outcome == AddOutcome.ACCEPTED and record is not None
    assert record.metrics["actor/loss"] == 2.0
