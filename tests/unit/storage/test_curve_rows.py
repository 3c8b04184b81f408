"""The key curves the history store packs beside each step (rlmon.service.storage.curve_rows):
written with the steps, what the page reads them from, back-filled on the first open of a store
written before they were kept, and pruned with their steps."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np

from rlmon.service.alerting.engine import AlertEvent
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.metrics import catalog
from rlmon.service.storage import curve_rows
from rlmon.service.storage.history import HistoryStore
from rlmon.service.web.api import PANELS, WebApi
from rlmon.service.web.curves import ColumnCache
from tests.support.records import step_record

RUN = "run-a"
T0 = 1_700_000_000.0
KL, ENTROPY, LOSS = catalog.KL, catalog.ENTROPY, catalog.LOSS


def records(first: int, last: int) -> list[StepRecord]:
    """Steps with a NaN, a +inf, a -inf and a step without entropy among ordinary values."""
    out = []
    for n in range(first, last):
        metrics = {KL: 0.01 * n, ENTROPY: 2.0 - 0.01 * n, LOSS: float(n)}
        metrics[KL] = {3: math.nan, 4: math.inf, 5: -math.inf}.get(n, metrics[KL])
        if n == 6:
            del metrics[ENTROPY]
        out.append(step_record(run=RUN, step=n, metrics=metrics, finalized_at=T0 + n))
    return out


def forget(path: Path) -> None:
    """The store as an rlmon from before the packed curves left it: no such tables."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("DROP TABLE curve_rows")
    db.execute("DROP TABLE curve_layout")
    db.close()


def curves(store: HistoryStore) -> dict[str, Any]:
    return WebApi(store).curves({"run": RUN, "role": "actor"})


def test_every_panel_metric_is_packed() -> None:
    drawn = {m for p in PANELS for m in p.metrics}
    assert drawn <= set(curve_rows.CURVE_METRICS)


def test_packed_values_keep_nan_inf_and_absent_apart() -> None:
    blob = curve_rows.pack({KL: math.nan, ENTROPY: -math.inf, catalog.REWARD: 1.5})
    values, absent = curve_rows.unpack([blob, blob])
    i = curve_rows.CURVE_METRICS.index
    assert values.shape == absent.shape == (2, len(curve_rows.CURVE_METRICS))
    assert math.isnan(values[0, i(KL)]) and not absent[0, i(KL)]
    assert values[1, i(ENTROPY)] == -math.inf and values[1, i(catalog.REWARD)] == 1.5
    assert absent[0, i(catalog.GRAD_NORM)] and absent.sum() == 2 * (values.shape[1] - 3)
    # the same from a stored line's JSON values and nonfinite names (the back-fill's input)
    k = len(curve_rows.CURVE_METRICS)
    stored: list[float | str | None] = [None] * (2 * k)
    stored[i(KL)], stored[k + i(KL)] = None, "NaN"
    stored[k + i(ENTROPY)], stored[i(catalog.REWARD)] = "-Infinity", 1.5
    assert curve_rows.pack_stored(*stored) == blob


def test_steps_written_are_read_back_from_their_packed_rows(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / "h.sqlite")
    store.add(records(0, 10))
    store.add(records(5, 12))  # a redelivery of 5..9 keeps one row each
    rows = store.curve_values(RUN, "actor", 0)
    assert rows is not None and [s for s, _ in rows] == list(range(12))
    assert [s for s, _ in store.curve_values(RUN, "actor", 0, after=9) or []] == [10, 11]
    cols = ColumnCache(store).get(RUN, "actor", 0, (KL, ENTROPY))
    assert cols.steps.tolist() == list(range(12))
    assert cols.nonfinite[KL].tolist() == [n in (3, 4, 5) for n in range(12)]
    assert not cols.nonfinite[ENTROPY].any() and math.isnan(cols.values[ENTROPY][6])
    assert cols.values[KL][4] == math.inf and cols.values[KL][7] == 0.07
    store.close()


def test_an_older_store_is_packed_on_its_first_open(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite"
    store = HistoryStore(path)
    store.add(records(0, 10))
    expected = curves(store)
    store.close()
    forget(path)
    # read-only, before any writer opened it: read from the step lines, the same answer
    reader = HistoryStore(path, read_only=True)
    assert reader.curve_values(RUN, "actor", 0) is None
    assert curves(reader) == expected
    reader.close()
    # the writer's first open packs every stored step once; a second open has nothing to do
    store = HistoryStore(path)
    rows = store.curve_values(RUN, "actor", 0)
    assert rows is not None and len(rows) == 10
    assert rows == [(r.step, curve_rows.pack(r.metrics)) for r in records(0, 10)]
    assert curves(store) == expected
    store.add(records(10, 12))
    store.close()
    reader = HistoryStore(path, read_only=True)
    assert len(reader.curve_values(RUN, "actor", 0) or []) == 12
    reader.close()


def test_the_curves_answer_marks_nan_and_inf_and_counts_them(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / "h.sqlite")
    store.add(records(0, 10))
    body = curves(store)
    panels = {tuple(p["metrics"]): p for p in body["panels"]}
    kl, entropy = panels[(KL,)], panels[(ENTROPY,)]
    assert kl["nonfinite"] == [{"count": 3, "x": [3, 4, 5], "value": ["NaN", "+Inf", "-Inf"]}]
    assert kl["y"][0][3:6] == [None, None, None]
    assert entropy["nonfinite"] == [{"count": 0, "x": [], "value": []}]  # absent is no NaN
    # an alert's values around its onset carry them too
    store.add([], [AlertEvent(RUN, "actor", 3, "KLNonFinite", "critical", "firing", KL,
                              math.nan)])
    around = WebApi(store).alert({"run": RUN, "role": "actor", "alert": "KLNonFinite"})["around"]
    assert around["nonfinite"] == {"count": 3, "x": [3, 4, 5], "value": ["NaN", "+Inf", "-Inf"]}
    # many more than the buckets: counted whole, one marker per bucket
    many = HistoryStore(tmp_path / "many.sqlite")
    many.add([step_record(run=RUN, step=n, metrics={KL: math.nan if n % 2 else 1.0},
                          finalized_at=T0 + n) for n in range(1_000)])
    marks = WebApi(many).curves({"run": RUN, "points": "10"})["panels"][0]["nonfinite"][0]
    assert marks["count"] == 500 and marks["x"] == list(range(1, 1_000, 100))
    store.close()
    many.close()


def test_a_layout_of_other_metrics_is_packed_again(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite"
    HistoryStore(path).add(records(0, 4))
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("UPDATE curve_layout SET metric = 'actor/retired' WHERE position = 0")
    db.close()
    reader = HistoryStore(path, read_only=True)
    assert reader.curve_values(RUN, "actor", 0) is None  # not read in a layout it does not know
    reader.close()
    store = HistoryStore(path)
    assert store.curve_values(RUN, "actor", 0) == [
        (r.step, curve_rows.pack(r.metrics)) for r in records(0, 4)]
    store.close()


def test_retention_prunes_the_packed_rows_with_their_steps(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / "h.sqlite")
    store.add(records(0, 10))
    store.add([step_record(run="quiet", step=0, metrics={KL: 1.0}, finalized_at=T0 - 1e6)])
    store.prune(keep_steps=4, quiet_before=T0 - 1)
    assert [s for s, _ in store.curve_values(RUN, "actor", 0) or []] == [6, 7, 8, 9]
    assert store.curve_values("quiet", "actor", 0) == []
    (left,), = store.read("SELECT COUNT(*) FROM curve_rows")
    assert left == 4
    cols = ColumnCache(store).get(RUN, "actor", 0, (KL,))
    assert np.allclose(cols.values[KL], [0.06, 0.07, 0.08, 0.09])
    store.close()
