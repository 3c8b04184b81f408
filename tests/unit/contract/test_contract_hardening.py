"""Contract hardening (issue 11), replay side: each class of adversarial input, not one example.

The live aggregator and the collector tier get the same classes in
``tests/test_contract_hardening_live.py``.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlmon.service.aggregation.assembly import StepAssembler
from rlmon.service.aggregation.finalized_steps import FinalizedSteps
from rlmon.service.alerting.rules import parse_rules
from rlmon.service.contract.acks import AddOutcome
from rlmon.service.contract.records import MAX_LINE_BYTES, ContractError, parse_line, parse_report
from rlmon.service.metrics.partial import REPLICA_RTOL
from rlmon.service.replay import replay
from tests.support.cli import run_rlmon
from tests.support.paths import REPO

ROOT = REPO
GOOD = {"run": "r", "role": "actor", "step": 0, "metrics": {"actor/loss": {"sum": 2.0, "count": 4}}}
HUGE = "9" * 5000  # beyond Python's 4300-digit conversion limit
WIDE = "9" * 400  # converts to an int, but not to a float


def line(**changes: Any) -> str:
    return json.dumps({**GOOD, **changes})


def around(bad: str) -> list[str]:
    return [line(step=1), bad, line(step=2)]


def with_literal(template: dict[str, Any], literal: str) -> str:
    """``template`` as JSON with the string "@" replaced by a raw literal (not valid as Python)."""
    return json.dumps(template).replace('"@"', literal)


# Every numeric field of a record, with the field path its error must name.
NUMERIC_FIELDS = [
    ({**GOOD, "step": "@"}, "step"),
    ({**GOOD, "seq": "@"}, "seq"),
    ({**GOOD, "minibatch": "@"}, "minibatch"),
    ({**GOOD, "time": "@"}, "time"),
    ({**GOOD, "rank": {"dp": "@"}}, "rank.dp"),
    ({**GOOD, "world": {"tp": "@"}}, "world.tp"),
    ({**GOOD, "metrics": {"m": {"sum": "@", "count": 1}}}, "metrics.m.sum"),
    ({**GOOD, "metrics": {"m": {"sum": 1, "count": "@"}}}, "metrics.m.count"),
    ({**GOOD, "metrics": {"m": {"min": "@"}}}, "metrics.m.min"),
    ({**GOOD, "metrics": {"m": {"max": "@"}}}, "metrics.m.max"),
    ({**GOOD, "metrics": {"m": {"sqsum": "@"}}}, "metrics.m.sqsum"),
    ({**GOOD, "metrics": {"m": {"value": "@"}}}, "metrics.m.value"),
    ({**GOOD, "metrics": {"m": {"count": "@", "sum": 1, "sqsum": 1}}}, "metrics.m.count"),
    ({**GOOD, "metrics": {"m": {"count": 1, "sum": 1, "sqsum": "@"}}}, "metrics.m.sqsum"),
]


@pytest.mark.parametrize("digits", [HUGE, "-" + HUGE, WIDE, "-" + WIDE])
@pytest.mark.parametrize(("template", "field"), NUMERIC_FIELDS)
def test_an_integer_too_large_to_convert_rejects_its_line_naming_the_field(
    template: dict[str, Any], field: str, digits: str,
) -> None:
    result = replay(around(with_literal(template, digits)))
    assert [e.line for e in result.errors] == [2]
    error = result.errors[0].error
    assert error.startswith(f"{field}: "), error
    assert len(error) < 200
    assert [r.step for r, _ in result.steps] == [1, 2]


@pytest.mark.parametrize("where", ["run", "role", "final", "metrics"])
def test_an_integer_too_large_where_no_number_goes_is_rejected_too(where: str) -> None:
    result = replay(around(with_literal({**GOOD, where: "@"}, HUGE)))
    assert [e.line for e in result.errors] == [2]
    assert result.errors[0].error.startswith(f"{where}: ")
    assert [r.step for r, _ in result.steps] == [1, 2]


def test_replay_command_keeps_going_after_a_huge_integer(tmp_path: Path) -> None:
    path = tmp_path / "huge.jsonl"
    path.write_text("\n".join(around(with_literal({**GOOD, "step": "@"}, HUGE))) + "\n")
    out = run_rlmon("replay", path, "--json")
    assert out.returncode == 2, out.stderr
    steps = [json.loads(x) for x in out.stdout.splitlines()]
    assert [s["step"] for s in steps if s["type"] == "step"] == [1, 2]
    error, summary = (json.loads(x) for x in out.stderr.splitlines())
    assert error["line"] == 2 and error["error"].startswith("step: ")
    assert summary["accepted"] == 2 and summary["rejected"] == 1


# ---- ReplicaMismatch is a function of the set of copies -----------------------------------------

FORM_KEYS = {
    "sum": ("sum",), "min": ("min",), "max": ("max",), "sqsum": ("sqsum",), "value": ("value",),
    "mean": ("sum", "count"), "moments": ("count", "sum", "sqsum"),
}


def reference_mismatch(copies: list[list[float]]) -> bool:
    """Copies disagree when two of them differ by more than a relative REPLICA_RTOL in a slot."""
    arr = np.array(copies, dtype=np.float64)
    for col in arr.T:
        nan = np.isnan(col)
        if nan.any():
            if not nan.all():
                return True
            continue
        lo, hi = float(col.min()), float(col.max())
        if lo == hi:
            continue
        if np.isinf(col).any() or abs(hi - lo) > REPLICA_RTOL * max(abs(lo), abs(hi)):
            return True
    return False


def _mismatch_for(form: str, copies: list[list[float]], order: tuple[int, ...]) -> bool:
    """Send copy i from rank tp=i (replicated over tp), in ``order``; the step's verdict."""
    asm = StepAssembler()
    record = None
    for i in order:
        partial: dict[str, Any] = dict(zip(FORM_KEYS[form], copies[i], strict=True))
        partial["replicated"] = ["tp"]
        _, record = asm.add(parse_report({
            "run": "r", "role": "actor", "step": 0, "rank": {"tp": i},
            "world": {"tp": len(copies)}, "metrics": {"m": partial},
        }))
    assert record is not None
    return "m" in record.replica_mismatches


def test_three_copies_that_disagree_are_caught_in_every_arrival_order() -> None:
    # rank 0 sits between the two others: each is within 1e-6 of it, not of each other.
    copies = [[1.0 + 0.9e-6], [1.0], [1.0 + 1.8e-6]]
    verdicts = {_mismatch_for("max", copies, order) for order in itertools.permutations(range(3))}
    assert verdicts == {True}


_BASE = st.one_of(st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False),
                  st.just(math.inf), st.just(math.nan))
_NUDGE = st.sampled_from([0.0, 0.0, 3e-7, -3e-7, 6e-7, -6e-7, 2e-6, -2e-6])


@st.composite
def _replicas(draw: st.DrawFn) -> tuple[str, list[list[float]], list[tuple[int, ...]]]:
    form = draw(st.sampled_from(sorted(FORM_KEYS)))
    n = draw(st.integers(2, 4))
    slots = len(FORM_KEYS[form])
    bases = [abs(draw(_BASE)) if form in ("mean", "moments", "sqsum") else draw(_BASE)
             for _ in range(slots)]
    copies = [[b * (1 + draw(_NUDGE)) if math.isfinite(b) else b for b in bases]
              for _ in range(n)]
    return form, copies, list(itertools.permutations(range(n)))


@settings(max_examples=300, deadline=None)
@given(_replicas())
def test_replica_mismatch_depends_on_the_set_of_copies_not_their_order(
    case: tuple[str, list[list[float]], list[tuple[int, ...]]],
) -> None:
    form, copies, orders = case
    if form in ("mean", "moments"):  # counts must be finite
        count = FORM_KEYS[form].index("count")
        for c in copies:
            c[count] = c[count] if math.isfinite(c[count]) else 1.0
    verdicts = {_mismatch_for(form, copies, order) for order in orders}
    assert len(verdicts) == 1
    assert verdicts == {reference_mismatch(copies)}


# ---- a step never finalized is never taken for late ---------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 300), max_size=200), st.integers(2, 8))
def test_finalized_steps_never_take_a_step_that_was_not_added(
    steps: list[int], limit: int,
) -> None:
    done = FinalizedSteps(limit=limit)
    for step in steps:
        done.add(step)
    assert len(done.intervals()) <= limit
    added = set(steps)
    for step in range(0, 320):
        if step not in added:
            assert step not in done, step
        else:
            assert step in done or done.forgot(step), step
    restored = FinalizedSteps.restore(done.floor, json.loads(json.dumps(done.intervals())))
    for step in range(0, 320):
        assert (step in restored, restored.forgot(step)) == (step in done, done.forgot(step))


def _record(step: int, value: float = 1.0) -> dict[str, Any]:
    return {"run": "r", "role": "actor", "step": step, "metrics": {"m": {"sum": value}}}


def test_a_step_in_an_old_gap_is_rejected_never_late_and_a_recent_gap_is_a_new_step() -> None:
    asm = StepAssembler()
    for step in range(1, 2 * 4096 + 200, 2):  # odd steps only: a gap before each
        asm.add(parse_report(_record(step)))
    late = asm.counters.late
    with pytest.raises(ContractError, match=r"^step: step 2 of r/actor is older"):
        asm.add(parse_report(_record(2)))
    assert asm.counters.late == late
    assert asm.counters.rejected == 1
    outcome, record = asm.add(parse_report(_record(2 * 4096 + 100, 5.0)))  # a recent gap
    assert outcome == AddOutcome.ACCEPTED and record is not None and record.metrics["m"] == 5.0
    outcome, _ = asm.add(parse_report(_record(2 * 4096 + 101)))  # finalized, recent: late
    assert outcome == AddOutcome.LATE


# ---- size limits in bytes -----------------------------------------------------------------------


def test_the_line_limit_counts_utf8_bytes_whether_the_line_is_text_or_bytes() -> None:
    wide = json.dumps({"x": "é" * (MAX_LINE_BYTES // 2 + 10)}, ensure_ascii=False)
    assert len(wide) < MAX_LINE_BYTES < len(wide.encode())
    for form in (wide, wide.encode()):
        with pytest.raises(ContractError, match="bytes exceeds"):
            parse_line(form)
    result = replay([line(step=1), wide, line(step=2)])  # text, as replay decodes it
    assert [e.line for e in result.errors] == [2]
    assert f"line of {len(wide.encode())} bytes exceeds" in result.errors[0].error
    exact = line(step=3)
    exact += " " * (MAX_LINE_BYTES - len(exact.encode()))
    assert parse_line(exact).step == 3 and parse_line(exact.encode()).step == 3


# ---- bare NaN / Infinity tokens -----------------------------------------------------------------


@pytest.mark.parametrize(("token", "expected"), [
    ("NaN", math.nan), ("Infinity", math.inf), ("-Infinity", -math.inf)])
def test_bare_non_finite_tokens_read_like_the_contract_strings(token: str, expected: float) -> None:
    bare = parse_line(with_literal({**GOOD, "metrics": {"m": {"max": "@"}}}, token))
    quoted = parse_line(json.dumps({**GOOD, "metrics": {"m": {"max": token}}}))
    value, = bare.metrics["m"].state
    assert value == quoted.metrics["m"].state[0] or (math.isnan(value) and math.isnan(expected))
    assert math.isnan(value) if math.isnan(expected) else value == expected


@pytest.mark.parametrize("token", ["nan", "inf", "-inf", "Inf", "+Infinity", "NAN"])
def test_other_non_finite_spellings_are_malformed_json(token: str) -> None:
    result = replay(around(with_literal({**GOOD, "metrics": {"m": {"max": "@"}}}, token)))
    assert [e.line for e in result.errors] == [2]
    assert "malformed JSON" in result.errors[0].error


def test_a_bare_nan_count_is_rejected_like_the_string() -> None:
    result = replay([with_literal({**GOOD, "metrics": {"m": {"sum": 1, "count": "@"}}}, "NaN")])
    assert "metrics.m.count: must be a finite number" in result.errors[0].error


# ---- limits the implementation enforces -----------------------------------------------------------


def test_role_is_at_most_64_characters() -> None:
    assert not replay([line(role="a" * 64)]).errors
    result = replay([line(role="a" * 65)])
    assert result.errors[0].error.startswith("role: must match [a-z][a-z0-9_]* (at most 64)")


# ---- open questions of the contract, answered -----------------------------------------------------


def test_a_metric_keeps_one_form_across_every_run_and_role_of_an_input() -> None:
    a = json.dumps({"run": "a", "role": "actor", "step": 0, "metrics": {"user/m": {"sum": 1}}})
    b = json.dumps({"run": "b", "role": "critic", "step": 0, "metrics": {"user/m": {"max": 1}}})
    result = replay([a, b])
    assert [e.line for e in result.errors] == [2]
    assert "metrics.user/m: sends form 'max' but the metric has form 'sum'" in result.errors[0].error


def test_a_late_record_is_late_unless_it_breaks_the_record_checks() -> None:
    done = json.dumps({**GOOD, "step": 0})
    late_other_form = json.dumps({**GOOD, "metrics": {"actor/loss": {"sum": 1.0}}})
    late_other_world = json.dumps({**GOOD, "world": {"dp": 2}})
    late_broken = json.dumps({**GOOD, "metrics": {"actor/loss": {"sum": 1.0, "count": -1}}})
    result = replay([done, late_other_form, late_other_world, late_broken])
    assert result.counters.late == 2
    assert [e.line for e in result.errors] == [4]
    assert result.errors[0].error.startswith("metrics.actor/loss.count: must be >= 0")


@pytest.mark.parametrize("option", [{"replicated": ["tp"]}, {"minibatch_reduce": "mean"}])
def test_ranks_of_one_step_disagreeing_on_an_option_reject_the_later_record(
    option: dict[str, Any],
) -> None:
    first = {"run": "r", "role": "actor", "step": 0, "world": {"tp": 2}, "rank": {"tp": 0},
             "metrics": {"user/m": {"sum": 1.0}}}
    second = {**first, "rank": {"tp": 1}, "metrics": {"user/m": {"sum": 2.0, **option}}}
    result = replay([json.dumps(first), json.dumps(second)])
    assert [e.line for e in result.errors] == [2]
    assert "metrics.user/m: form 'sum' / replicated / minibatch_reduce differ" in \
        result.errors[0].error
    (record, _), = result.steps
    assert record.metrics["user/m"] == 1.0 and not record.complete


def test_a_ranks_record_after_its_own_final_record_is_late_in_every_order() -> None:
    def rec(dp: int, value: float, final: bool = True) -> str:
        return json.dumps({"run": "r", "role": "actor", "step": 0, "world": {"dp": 2},
                           "rank": {"dp": dp}, "final": final,
                           "metrics": {"user/m": {"sum": value}}})

    after_own_final = rec(0, 100.0)
    for lines in ([rec(0, 1.0), after_own_final, rec(1, 2.0)],
                  [rec(0, 1.0), rec(1, 2.0), after_own_final]):
        result = replay(lines)
        assert not result.errors
        assert result.counters.late == 1
        (record, _), = result.steps
        assert record.complete and record.metrics["user/m"] == 3.0


def test_count_zero_means_absent_unless_the_sum_is_not_finite() -> None:
    def mean(total: Any, count: float, step: int, dp: int = 0, world: int = 1) -> str:
        return json.dumps({"run": "r", "role": "actor", "step": step, "rank": {"dp": dp},
                           "world": {"dp": world}, "metrics": {"user/m": {"sum": total,
                                                                           "count": count}}})

    result = replay([mean(5.0, 0, 0), mean("NaN", 0, 1), mean(5.0, 0, 2, 0, 2),
                     mean(3.0, 2, 2, 1, 2)])
    assert not result.errors
    steps = {r.step: (r, events) for r, events in result.steps}
    assert "user/m" not in steps[0][0].metrics  # nothing to average over: absent, not 5 or 0
    assert math.isnan(steps[1][0].metrics["user/m"])
    assert [e.alert for e in steps[1][1]] == ["NonFiniteMetric"]
    assert steps[2][0].metrics["user/m"] == (5.0 + 3.0) / 2  # the sum still counts when pooled


def test_integral_floats_are_integers_and_other_floats_are_not() -> None:
    report = parse_line(line(step=3.0, rank={"dp": 1.0}, world={"dp": 2.0}, seq=7.0,
                             minibatch=2.0))
    assert (report.step, report.rank.dp, report.world.dp, report.seq, report.minibatch) == \
        (3, 1, 2, 7, 2)
    assert all(type(v) is int for v in (report.step, *report.rank, *report.world, report.seq))
    for bad, field in ((line(step=3.5), "step"), (line(world={"dp": 2.5}), "world.dp"),
                       (line(rank={"dp": 0.5}, world={"dp": 2}), "rank.dp")):
        with pytest.raises(ContractError, match=f"^{field}: must be an integer"):
            parse_line(bad)


def test_unknown_fields_are_rejected_at_every_level() -> None:
    result = replay([line(version=2), line(metrics={"m": {"sum": 1, "unit": "s"}})])
    assert [e.error for e in result.errors] == ["version: unknown field",
                                                "metrics.m.unit: unknown key in a partial"]


RULES = """
include_defaults: false
rules:
  - {name: High, severity: warning, condition: threshold, metric: user/x, op: ">", threshold: 10}
  - {name: HighTwice, severity: warning, condition: threshold, metric: user/y, op: ">",
     threshold: 10, for: 2}
  - {name: NonFiniteMetric, severity: critical, condition: non_finite}
"""


def test_threshold_rules_skip_non_finite_values_and_non_finite_metric_fires() -> None:
    rules = parse_rules(RULES)
    lines_ = [line(step=s, metrics={"user/x": {"max": v}})
              for s, v in enumerate(["Infinity", "-Infinity", 11.0])]
    result = replay(lines_, rules)
    fired = [(r.step, e.alert, e.state) for r, events in result.steps for e in events]
    assert sorted(fired) == [(0, "NonFiniteMetric", "firing"), (2, "High", "firing"),
                             (2, "NonFiniteMetric", "resolved")]


def test_a_step_lacking_the_metric_neither_breaks_nor_extends_a_for_streak() -> None:
    rules = parse_rules(RULES)
    metrics = [{"user/y": {"max": 11.0}}, {"user/z": {"max": 0.0}}, {"user/y": {"max": 11.0}}]
    result = replay([line(step=s, metrics=m) for s, m in enumerate(metrics)], rules)
    fired = [(r.step, e.alert) for r, events in result.steps for e in events]
    assert fired == [(2, "HighTwice")]
    shorter = replay([line(step=s, metrics=m) for s, m in enumerate(metrics[:2])], rules)
    assert not shorter.alerts


def test_gaps_in_minibatch_indices_average_over_the_minibatches_present() -> None:
    def rec(mb: int, total: float, count: float, final: bool) -> str:
        return json.dumps({"run": "r", "role": "actor", "step": 0, "minibatch": mb,
                           "final": final, "metrics": {"user/m": {
                               "sum": total, "count": count, "minibatch_reduce": "mean"}}})

    result = replay([rec(0, 2.0, 1, False), rec(5, 12.0, 3, True)])
    (record, _), = result.steps
    assert record.metrics["user/m"] == np.mean([2.0 / 1, 12.0 / 3])


def test_a_rank_that_sent_only_non_final_records_is_missing_but_its_partials_count() -> None:
    def rec(dp: int, final: bool) -> str:
        return json.dumps({"run": "r", "role": "actor", "step": 0, "world": {"dp": 2},
                           "rank": {"dp": dp}, "final": final,
                           "metrics": {"user/m": {"sum": 1.0 + dp}}})

    result = replay([rec(0, True), rec(1, False), rec(1, False)])
    (record, events), = result.steps
    assert not record.complete and record.ranks_reporting == 1
    assert [r.dp for r in record.missing_ranks] == [1]
    assert record.metrics["user/m"] == 1.0 + 2.0 + 2.0
    assert "RankMissing" in [e.alert for e in events]


def test_a_float_literal_beyond_the_range_reads_as_infinity() -> None:
    report = parse_line(with_literal({**GOOD, "metrics": {"m": {"max": "@"}}}, "-1e400"))
    assert report.metrics["m"].state == (-math.inf,)


def test_the_forgotten_span_survives_a_restart_through_the_watermark(tmp_path: Path) -> None:
    from rlmon.service.aggregation.watermark import WatermarkStore

    asm = StepAssembler()
    records = [r for step in range(1, 2 * 4096 + 200, 2)
               if (r := asm.add(parse_report(_record(step)))[1]) is not None]
    done = asm.finalized[("r", "actor")]
    assert done.forgot(2) and 2 not in done and 0 not in done
    store = WatermarkStore(tmp_path / "w.sqlite")
    store.commit(asm.finalized, records[-1:])
    loaded = WatermarkStore(tmp_path / "w.sqlite").load()[("r", "actor")]
    for step in range(0, 2 * 4096 + 210):
        assert (step in loaded, loaded.forgot(step)) == (step in done, done.forgot(step)), step


# ---- any value in any field: a line is accepted or rejected, the run never ends -----------------

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**30), 10**30) | st.floats() | st.text(max_size=8)
    | st.sampled_from(["NaN", "Infinity", "-Infinity", "@huge", "@wide"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                max_size=3),
    max_leaves=8,
)
_PATHS = [("step",), ("seq",), ("minibatch",), ("time",), ("final",), ("run",), ("role",),
          ("rank",), ("rank", "dp"), ("world",), ("world", "pp"), ("metrics",),
          ("metrics", "m"), ("metrics", "m", "sum"), ("metrics", "m", "count"),
          ("metrics", "m", "replicated"), ("metrics", "m", "minibatch_reduce")]


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(_PATHS), _JSON)
def test_any_value_in_any_field_is_accepted_or_rejected_and_replay_goes_on(
    path: tuple[str, ...], value: Any,
) -> None:
    record: dict[str, Any] = {**GOOD, "step": 1, "rank": {"dp": 0}, "world": {"dp": 1},
                              "metrics": {"m": {"sum": 1.0, "count": 2}}}
    target = record
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    text = json.dumps(record).replace('"@huge"', HUGE).replace('"@wide"', WIDE)
    result = replay([line(step=0), text, line(step=2)])
    assert {0, 2} <= {r.step for r, _ in result.steps}
    c = result.counters
    assert c.accepted + c.late + c.duplicates + len(result.errors) == 3
    for error in result.errors:
        assert error.line == 2 and len(error.error) < 300
