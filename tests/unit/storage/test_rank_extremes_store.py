"""The history store keeps each step's per-rank extremes beside it (the page's band): read back
exactly (NaN and Inf included) for the steps and metrics asked, pruned with their steps, and
absent, not an error, in a store written before they were kept."""

from __future__ import annotations

import math
import sqlite3
from dataclasses import replace
from pathlib import Path

from rlmon.service.storage.extremes_rows import Extremes
from rlmon.service.storage.history import HistoryStore
from tests.support.records import step_record

T0 = 1_700_000_000.0


def _by_step(extremes: Extremes) -> dict[int, tuple[float, float]]:
    steps, lows, highs = extremes
    return {int(s): (lo, hi) for s, lo, hi in zip(steps.tolist(), lows.tolist(), highs.tolist(),
                                                   strict=True)}


def test_extremes_round_trip_and_leave_with_their_steps(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / "h.sqlite")
    records = [replace(step_record(run="r", step=n, metrics={"actor/kl": 0.1 * n},
                                   finalized_at=T0 + n),
                       rank_extremes={"actor/kl": (0.05 * n, 0.2 * n),
                                      "user/x": (-math.inf, math.nan)})
               for n in range(6)]
    records.append(step_record(run="r", step=6, metrics={"actor/kl": 1.0}, finalized_at=T0 + 6))
    # another layout (other metrics, in another order)
    records.append(replace(step_record(run="r", step=7, metrics={"actor/kl": 1.0},
                                       finalized_at=T0 + 7),
                           rank_extremes={"user/y": (1.0, 2.0), "actor/kl": (0.25, 4.0)}))
    store.add(records)
    store.add(records[:2])  # a redelivery keeps one row
    got = {m: _by_step(e) for m, e in store.rank_extremes(
        "r", "actor", 0, [1, 3, 6, 7, 99], ["actor/kl", "user/x", "nope"]).items()}
    assert got["actor/kl"] == {1: (0.05, 0.2), 3: (0.05 * 3, 0.2 * 3), 7: (0.25, 4.0)}
    lo, hi = got["user/x"][3]
    assert lo == -math.inf and math.isnan(hi)
    assert got["nope"] == {}
    assert _by_step(store.rank_extremes("r", "actor", 1, [1], ["actor/kl"])["actor/kl"]) == {}
    store.prune(keep_steps=3)
    assert sorted(_by_step(store.rank_extremes("r", "actor", 0, range(8), ["actor/kl"])[
        "actor/kl"])) == [5, 7]
    (layouts,), = store.read("SELECT COUNT(*) FROM extremes_layout")
    assert layouts == 2
    store.prune(keep_steps=3, quiet_before=T0 + 100)
    (left,), = store.read("SELECT COUNT(*) FROM rank_extremes")
    (layouts,), = store.read("SELECT COUNT(*) FROM extremes_layout")
    assert left == layouts == 0  # the layouts no step uses leave too
    store.close()


def test_a_store_written_before_the_extremes_has_none(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite"
    HistoryStore(path).close()
    db = sqlite3.connect(path)
    db.execute("DROP TABLE rank_extremes")
    db.execute("DROP TABLE extremes_layout")
    db.commit()
    db.close()
    reader = HistoryStore(path, read_only=True)
    assert _by_step(reader.rank_extremes("r", "actor", 0, [1], ["actor/kl"])["actor/kl"]) == {}
    reader.close()
    writer = HistoryStore(path)  # the writer adds the table
    writer.add([replace(step_record(run="r", step=1, metrics={"actor/kl": 1.0}),
                        rank_extremes={"actor/kl": (0.5, 2.0)})])
    assert _by_step(writer.rank_extremes("r", "actor", 0, [1], ["actor/kl"])["actor/kl"]) == {
        1: (0.5, 2.0)}
    writer.close()
