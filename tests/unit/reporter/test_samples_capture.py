"""Sample capture on the host (the Reporter's record_samples and numpy record_sample_tensor):
the best k per step across ranks and micro-batches, payloads opt-in, redacted, cut and counted."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlmon.actors.reporter import Reporter
from rlmon.actors.reporter.sample_capture import cut_payload, pick_array
from rlmon.actors.reporter.sink import LocalSink
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.metrics import catalog
from rlmon.service.metrics.ranked_forms import MAX_PAYLOAD_BYTES


def _reporters(world: int, **kwargs: object) -> tuple[LocalSink, list[Reporter]]:
    sink = LocalSink()
    return sink, [Reporter("r", "actor", sink=sink, step_seconds=False, rank={"dp": i},
                           world={"dp": world}, **kwargs) for i in range(world)]  # type: ignore[arg-type]


def _step(sink: LocalSink, reps: list[Reporter], step: int = 0) -> StepRecord:
    for rep in reps:
        rep.end_step(step)
        assert rep.flush(10)
    (record,) = [r for r in sink.records if r.step == step]
    return record


def _truth(scores: np.ndarray, k: int, largest: bool) -> list[tuple[float, int]]:
    """Brute force: NaN first, then the best scores, ties by index."""
    def order(i: int) -> tuple[int, float, int]:
        s = float(scores[i])
        return (0, 0.0, i) if math.isnan(s) else (1, -s if largest else s, i)
    return [(float(scores[i]), i) for i in sorted(range(len(scores)), key=order)[:k]]


_VALUE = st.sampled_from([0.0, 0.5, 1.0, 2.0, -1.0, math.inf, -math.inf, math.nan])


@settings(max_examples=80, deadline=None)
@given(rows=st.lists(st.lists(st.tuples(_VALUE, st.booleans()), min_size=1, max_size=4),
                     min_size=1, max_size=12),
       score=st.sampled_from(["mean", "max", "min", "sum"]), k=st.integers(1, 5),
       largest=st.booleans())
def test_pick_array_is_the_brute_force_per_sequence_ranking(
        rows: list[list[tuple[float, bool]]], score: str, k: int, largest: bool) -> None:
    width = max(len(r) for r in rows)
    values = np.zeros((len(rows), width))
    mask = np.zeros((len(rows), width), dtype=bool)
    for i, row in enumerate(rows):
        for j, (v, keep) in enumerate(row):
            values[i, j], mask[i, j] = v, keep
    per_seq = []
    for i in range(len(rows)):
        picked = [float(v) for v, keep in zip(values[i], mask[i], strict=True) if keep]
        if not picked:
            per_seq.append(None)
            continue
        with np.errstate(invalid="ignore"):
            per_seq.append({"mean": float(np.sum(picked)) / len(picked), "sum": float(np.sum(picked)),
                            "max": max(picked, key=lambda x: (not math.isnan(x), x))
                            if not any(map(math.isnan, picked)) else math.nan,
                            "min": min(picked) if not any(map(math.isnan, picked))
                            else math.nan}[score])
    valid = [i for i, s in enumerate(per_seq) if s is not None]
    want = [(s, valid[j]) for s, j in _truth(np.array([per_seq[i] for i in valid]), k, largest)]
    got = pick_array(values, mask, score, k, largest)
    assert [i for _, i in got] == [i for _, i in want]
    for (a, _), (b, _) in zip(got, want, strict=True):
        assert a == pytest.approx(b, nan_ok=True)


@settings(max_examples=40, deadline=None)
@given(scores=st.lists(st.floats(-10, 10) | st.just(math.nan), min_size=1, max_size=40),
       ranks=st.integers(1, 3), micro=st.integers(1, 3), k=st.integers(1, 6),
       largest=st.booleans())
def test_any_split_over_ranks_and_micro_batches_gives_the_global_top_k(
        scores: list[float], ranks: int, micro: int, k: int, largest: bool) -> None:
    sink, reps = _reporters(ranks)
    where = {}  # sequence -> (rank, its place in that rank's step)
    parts: dict[tuple[int, int], list[int]] = {}
    for i in range(len(scores)):
        parts.setdefault((i % ranks, (i // ranks) % micro), []).append(i)
    for (dp, _mb), seqs in sorted(parts.items()):
        rep = reps[dp]
        offset = sum(len(s) for (d, m), s in parts.items() if d == dp and m < _mb)
        for j, seq in enumerate(seqs):
            where[f"dp{dp}/{offset + j}"] = seq
        rep.record_sample_tensor("custom/worst", np.array([scores[s] for s in seqs]),
                                 k=k, largest=largest, payload=[f"seq {s}" for s in seqs])
    record = _step(sink, reps)
    items = record.samples["custom/worst"]
    want = _truth(np.array(scores), k, largest)
    got_scores = [s for s, _, _ in items]
    assert got_scores == pytest.approx([s for s, _ in want], nan_ok=True)
    assert all(p == f"seq {where[i]}" for _, i, p in items)  # each id names its sequence
    for rep in reps:
        rep.close()


def test_record_samples_keeps_the_best_k_and_the_catalog_fixes_the_direction() -> None:
    sink, (rep,) = _reporters(1)
    rep.record_samples(catalog.REWARD_LOWEST, [(1.0, "q1", "fine"), (-2.0, "q2", "broken"),
                                               (0.0, "q3", None)], k=2)
    rep.record_samples(catalog.REWARD_LOWEST, [(-3.0, "q4", "")], k=2)
    with pytest.raises(ValueError, match="lowest"):
        rep.record_samples(catalog.REWARD_LOWEST, [], largest=True)
    with pytest.raises(ValueError, match="not a ranked form"):
        rep.record_samples(catalog.REWARD, [(1.0, "a", "")])
    with pytest.raises(ValueError, match="k must be"):
        rep.record_samples("custom/s", [], k=0)
    record = _step(sink, [rep])
    assert record.samples[catalog.REWARD_LOWEST] == ((-3.0, "q4", ""), (-2.0, "q2", "broken"))
    assert record.metrics[catalog.REWARD_LOWEST] == -3.0
    rep.close()


def test_payloads_are_opt_in_redacted_and_cut_at_a_utf8_boundary_counted() -> None:
    sink, (rep,) = _reporters(1, redact=lambda text: text.replace("secret", "[redacted]"))
    long = "é" * MAX_PAYLOAD_BYTES  # two bytes each: cut in half, never inside a character
    rep.record_sample_tensor(catalog.LOGP_DIFF_WORST, np.array([[0.5, 0.1], [2.0, 2.0]]))
    rep.record_samples("custom/texts", [(1.0, "a", "my secret prompt"), (2.0, "b", long)])
    record = _step(sink, [rep])
    assert [p for _, _, p in record.samples[catalog.LOGP_DIFF_WORST]] == ["", ""]  # opt-in
    (_, _, cut), (_, _, redacted) = record.samples["custom/texts"]
    assert redacted == "my [redacted] prompt"
    assert cut == "é" * (MAX_PAYLOAD_BYTES // 2) and rep.payloads_cut == 1
    assert cut_payload("a\ud800b") == ("a?b", False)  # a lone surrogate is not UTF-8
    rep.close()


def test_payload_is_asked_only_for_the_selected_and_a_failing_one_is_refused() -> None:
    sink, (rep,) = _reporters(1)
    asked: list[int] = []

    def payload(i: int) -> str:
        asked.append(i)
        return f"response {i}"

    rep.record_sample_tensor("custom/worst", np.arange(100.0), k=3, payload=payload)
    rep.record_samples("custom/other", [(1.0, "a", "")])
    record = _step(sink, [rep])
    assert sorted(asked) == [97, 98, 99]
    assert [i for _, i, _ in record.samples["custom/worst"]] == ["dp0/99", "dp0/98", "dp0/97"]
    rep.close()


def test_a_ranked_statistic_in_record_many() -> None:
    sink, (rep,) = _reporters(1)
    rep.record_many({"custom/m": {"k": 2, "bottom": [[3.0, "a"], [1.0, "b", "p"], [2.0, "c"]]},
                     "custom/bad": {"k": 2, "top": [[1.0]]}})
    record = _step(sink, [rep])
    assert record.samples["custom/m"] == ((1.0, "b", "p"), (2.0, "c", ""))
    assert "custom/bad" not in record.metrics and rep.rejected == 1
    rep.close()


def test_the_jsonl_sink_writes_ranked_partials_that_replay_reads(tmp_path: object) -> None:
    from pathlib import Path

    from rlmon.actors.reporter.sink import JsonlSink
    from rlmon.service.replay import replay

    path = Path(str(tmp_path)) / "run.jsonl"
    rep = Reporter("r", "actor", sink=JsonlSink(str(path)), step_seconds=False, rank={},
                   world={}, start_service=False)
    rep.record_samples(catalog.REWARD_LOWEST, [(math.nan, "a", "x"), (-1.0, "b", "")])
    rep.end_step(0)
    assert rep.flush(10)
    rep.close()
    with path.open("rb") as handle:
        result = replay(handle)
    assert result.exit_code == 0
    ((record, _events),) = result.steps
    assert record.samples[catalog.REWARD_LOWEST][1] == (-1.0, "b", "")
