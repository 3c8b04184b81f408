"""State files: a private per-user default directory, and an outbox that never unpickles."""

from __future__ import annotations

import math
import os
import pickle
import sqlite3
import stat
from pathlib import Path

import pytest

from rlmon.actors.runtime import RuntimeOptions, default_state_dir
from rlmon.service.aggregation.watermark import WatermarkStore, decode_record, encode_record
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.metrics.rank import Rank
from tests.support.records import step_record


def test_default_state_dir_is_per_user_and_private(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("RLMON_STATE_DIR", raising=False)
    path = Path(RuntimeOptions().resolved_state_dir("ns"))
    assert path == tmp_path / "state" / "rlmon" / "ns"
    assert stat.S_IMODE(path.stat().st_mode) == 0o700
    path.chmod(0o755)  # left open by an older version: tightened
    assert stat.S_IMODE(Path(default_state_dir("ns")).stat().st_mode) == 0o700
    escaped = Path(default_state_dir("../../etc"))  # a namespace is not a path
    assert escaped.parent == tmp_path / "state" / "rlmon"


def test_without_a_writable_home_the_state_dir_is_a_fresh_private_tempdir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("XDG_STATE_HOME", str(blocker))
    path = Path(default_state_dir("ns"))
    assert path.is_dir() and not str(path).startswith(str(blocker))
    assert stat.S_IMODE(path.stat().st_mode) == 0o700
    again = Path(default_state_dir("ns"))
    assert again != path  # not a fixed, guessable name
    path.rmdir()
    again.rmdir()


def _record(**metrics: float) -> StepRecord:
    return step_record(step=7, complete=False, ranks_expected=4, ranks_reporting=3,
                       missing_ranks=(Rank(dp=1, tp=1),), metrics=metrics,
                       replica_mismatches=("actor/lr",), first_seen=1.5, finalized_at=2.5,
                       time=1.7e9)


def test_records_round_trip_through_json_including_nan_and_inf() -> None:
    rec = _record(**{"a": 1.25, "b": math.inf, "c": -math.inf, "d": 0.0})
    rec = StepRecord(**{**{f: getattr(rec, f) for f in rec.__dataclass_fields__},
                        "metrics": {**rec.metrics, "e": math.nan}})
    back = decode_record(encode_record(rec))
    assert math.isnan(back.metrics["e"])
    assert {k: v for k, v in back.metrics.items() if k != "e"} == {
        "a": 1.25, "b": math.inf, "c": -math.inf, "d": 0.0}
    assert back == StepRecord(**{**{f: getattr(rec, f) for f in rec.__dataclass_fields__},
                                 "metrics": back.metrics})


class _Planted:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("touch planted-marker",))


def test_a_planted_pickle_in_the_outbox_is_skipped_not_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "watermark-0.sqlite"
    store = WatermarkStore(db)
    good = _record(**{"a": 1.0})
    store.close()
    con = sqlite3.connect(db)
    con.execute("INSERT INTO record_outbox VALUES (?, ?, ?, ?)",
                ("r", "actor", 1, pickle.dumps(_Planted())))
    con.execute("INSERT INTO record_outbox VALUES (?, ?, ?, ?)",
                ("r", "actor", 7, encode_record(good)))
    con.commit()
    con.close()
    again = WatermarkStore(db)
    assert again.undelivered() == [good]
    assert not (tmp_path / "planted-marker").exists()
    again.close()
