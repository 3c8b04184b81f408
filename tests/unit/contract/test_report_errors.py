"""Bad input: every rejection names the line and the field; valid lines are still processed."""

from __future__ import annotations

import json

import pytest

from rlmon.service.replay import replay

GOOD = {"run": "r", "role": "actor", "step": 0, "metrics": {"actor/loss": {"sum": 2.0, "count": 4}}}


def with_(**changes: object) -> str:
    record = dict(GOOD)
    record.update(changes)
    return json.dumps(record)


CASES = [
    ("{not json", "malformed JSON"),
    ("[1, 2]", "a record must be a JSON object"),
    (json.dumps({"role": "actor", "step": 0, "metrics": {}}), "run: required field is missing"),
    (with_(run="bad run!"), "run: must be 1-128 chars"),
    (with_(run="x" * 129), "run: must be 1-128 chars"),
    (with_(role="Actor"), "role: must match"),
    (with_(step=-1), "step: must be between 0"),
    (with_(step="3"), "step: must be an integer"),
    (with_(step=10**30), "step: must be between 0"),
    (with_(step=1.5), "step: must be an integer"),
    (with_(final="yes"), "final: must be true or false"),
    (with_(rank={"dp": -1}), "rank.dp: must be between 0"),
    (with_(rank={"ep": 1}), "rank: unknown axis 'ep'"),
    (with_(rank={"dp": 2}, world={"dp": 2}), "rank: {'dp': 2"),
    (with_(world={"dp": 0}), "world.dp: must be between 1"),
    (with_(extra=1), "extra: unknown field"),
    (with_(metrics=[]), "metrics: must be an object"),
    (with_(metrics={"m": {"sum": 1, "count": -3}}), "metrics.m.count: must be >= 0, got -3"),
    (with_(metrics={"m": {"sqsum": -1}}), "metrics.m.sqsum: must be >= 0"),
    (with_(metrics={"m": {"sum": "abc", "count": 1}}), 'metrics.m.sum: must be a number or "NaN"'),
    (with_(metrics={"m": {"min": 1, "max": 2}}), "metrics.m: statistic keys {max, min} are not one form"),
    (with_(metrics={"m": {"avg": 1}}), "metrics.m.avg: unknown key"),
    (with_(metrics={"m": {}}), "metrics.m: statistic keys {none}"),
    (with_(metrics={"m": 3}), "metrics.m: a partial must be an object"),
    (with_(metrics={"m": {"sum": 1, "replicated": ["xp"]}}), "metrics.m.replicated: unknown axis"),
    (with_(metrics={"m": {"sum": 1, "minibatch_reduce": "max"}}), "metrics.m.minibatch_reduce"),
    (with_(metrics={"actor/loss": {"sum": 1.0}}), "metrics.actor/loss: sends form 'sum'"),
    (with_(time=-5), "time: must be unix seconds"),
    (with_(seq=True), "seq: must be an integer"),
]


@pytest.mark.parametrize(("line", "message"), CASES)
def test_bad_line_is_rejected_with_field_and_rest_processed(line: str, message: str) -> None:
    good_before = json.dumps({**GOOD, "step": 1})
    good_after = json.dumps({**GOOD, "step": 2})
    result = replay([good_before, line, good_after])
    assert [e.line for e in result.errors] == [2]
    assert message in result.errors[0].error
    assert [r.step for r, _ in result.steps] == [1, 2]
    assert result.exit_code == 2


def test_oversized_line_and_non_utf8() -> None:
    from rlmon.service.contract.records import MAX_LINE_BYTES

    big = json.dumps({**GOOD, "run": "r"}) + " " * MAX_LINE_BYTES
    result = replay([big, b"\xff\xfe{}", json.dumps(GOOD)])
    assert [e.line for e in result.errors] == [1, 2]
    assert "exceeds" in result.errors[0].error
    assert "UTF-8" in result.errors[1].error
    assert len(result.steps) == 1


def test_world_disagreement_within_a_step_is_rejected() -> None:
    a = json.dumps({**GOOD, "rank": {"dp": 0}, "world": {"dp": 2}, "final": False})
    b = json.dumps({**GOOD, "rank": {"dp": 1}, "world": {"dp": 4}})
    result = replay([a, b])
    assert result.errors[0].line == 2
    assert "world: {'dp': 4" in result.errors[0].error


def test_non_finite_strings_and_tokens_are_accepted() -> None:
    lines = [
        json.dumps({**GOOD, "metrics": {"m": {"max": "Infinity"}}}),
        '{"run": "r", "role": "actor", "step": 1, "metrics": {"m": {"max": NaN}}}',
    ]
    result = replay(lines)
    assert not result.errors
    assert result.steps[0][0].metrics["m"] == float("inf")


@pytest.mark.parametrize("count", ["NaN", "Infinity"])
def test_non_finite_count_is_rejected(count: str) -> None:
    result = replay([with_(metrics={"m": {"sum": 1.0, "count": count}})])
    assert "metrics.m.count: must be a finite number" in result.errors[0].error


def test_absurd_step_message_is_short() -> None:
    result = replay([with_(step=10**300)])
    assert len(result.errors[0].error) < 200
