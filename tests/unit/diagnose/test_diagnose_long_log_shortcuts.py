"""A long log's shortcuts give what the step-by-step paths give, on generated data (seeded).

- the columns a reader builds (:class:`RowsBuilder`, a block of rows at a time) hold the rows
  merged as a dict per step would (repeats of a step, steps met late, keys first logged midway,
  across many blocks);
- the sanity checks observed only where :meth:`SanityChecker.may_act` says they can act find
  what observing every step finds (losses stuck at ln 2 and ln 3, NaN grad norms under the
  DeepSpeed bug, collapsing loss scales);
- a missing key found from the columns (``_gaps`` on a :class:`ColumnRows`) is the one the
  walk over the rows as dicts finds;
- ``diagnose`` of a log held by column raises what it raises of the same rows as dicts.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from rlmon.service.alerting import sanity
from rlmon.service.diagnose import columns, findings
from rlmon.service.diagnose.columns import ColumnRows, RowsBuilder
from rlmon.service.diagnose.logged_run import LoggedRun
from rlmon.service.diagnose.mapping import map_keys
from rlmon.service.metrics import catalog as c
from rlmon.service.metrics import keymaps


def _merged(adds: list[tuple[int, dict[str, float]]]) -> dict[int, dict[str, float]]:
    rows: dict[int, dict[str, float]] = {}
    for step, values in adds:
        rows.setdefault(step, {}).update(values)
    return dict(sorted(rows.items()))


def _same(a: dict[int, dict[str, float]], b: dict[int, dict[str, float]]) -> bool:
    """Equal rows (NaN equal to NaN; a row's keys in any order)."""
    return repr({s: sorted(r.items()) for s, r in a.items()}) == \
        repr({s: sorted(r.items()) for s, r in b.items()})


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("late", [False, True])
@pytest.mark.parametrize("logged", [0.7, 1.0])  # 1.0: blocks where every row has every key
def test_rows_builder_holds_the_rows_merged(seed: int, late: bool, logged: float,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(columns, "_BLOCK", 7)  # many blocks, a repeat across their edges
    rng = np.random.default_rng(seed)
    keys = [f"k{i}" for i in range(6)]
    adds: list[tuple[int, dict[str, float]]] = []
    step = 0
    for _ in range(400):
        step += int(rng.choice([0, 1, 1, 1, 3]))  # 0: the step again (an eval entry)
        # now and then a step met after a later one
        at = int(rng.integers(0, step + 1)) if late and rng.random() < 0.03 else step
        # keys first logged midway, NaN and Inf as values
        known = keys[:2 + min(4, step // 80)]
        if rng.random() < 0.3:
            known = known[::-1]  # a row's keys in another order
        adds.append((at, {k: float(rng.choice([rng.standard_normal(), math.nan, math.inf]))
                          for k in known if rng.random() < logged}))
    builder = RowsBuilder()
    for at, values in adds:
        builder.add(at, values)
    expected = _merged(adds)
    assert builder.steps >= len(expected)
    rows = builder.build()
    assert _same({s: dict(r) for s, r in rows.items()}, expected)
    if isinstance(rows, ColumnRows):
        firsts = list(dict.fromkeys(k for _, values in adds for k in values))
        assert rows.columns == firsts  # in the order first logged
        for key in firsts:
            logged = rows.logged(key)
            assert logged.tolist() == [key in r for r in expected.values()]


def _sanity_columns(seed: int, n: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Loss, relayed loss, grad norm and loss scale per step with stretches at ln 2 and ln 3
    (some within the tolerance, some just outside), NaN grad norms, collapsing and negative
    loss scales, each key missing at some steps."""
    rng = np.random.default_rng(seed)
    out = {}
    for key in (c.LOSS, keymaps.relay_name("trl", "loss")):
        values = 0.5 + 0.1 * rng.standard_normal(n)
        for _ in range(int(rng.integers(3, 12))):
            start, length = int(rng.integers(0, n)), int(rng.choice([1, 3, 4, 5, 6, 20]))
            const = float(rng.choice([sanity.LN2, sanity.LN3]))
            noise = float(rng.choice([0.0, 1e-3, 2.5e-3]))
            stretch = values[start:start + length]
            stretch[:] = const + noise * rng.choice([-1, 1], len(stretch))
        values[rng.random(n) < 0.02] = math.nan
        out[key] = (values, rng.random(n) < 0.9)
    grad = np.abs(1.0 + 0.1 * rng.standard_normal(n))
    for _ in range(int(rng.integers(2, 8))):
        start = int(rng.integers(0, n))
        grad[start:start + int(rng.choice([1, 2, 6]))] = math.nan
    out[c.GRAD_NORM] = (grad, rng.random(n) < 0.9)
    scale = np.full(n, 65536.0)
    for _ in range(int(rng.integers(1, 6))):
        start = int(rng.integers(0, n))
        scale[start:start + int(rng.choice([1, 4, 15]))] = float(
            rng.choice([1.0, 128.0, 0.5, -2.0, math.inf, math.nan]))
    out[c.LOSS_SCALE] = (scale, rng.random(n) < float(rng.choice([0.0, 0.3, 0.95])))
    return out


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize(("dpo", "deepspeed"), [(False, None), (True, "0.14.0"),
                                                (False, "0.13.5"), (True, "0.15.1")])
def test_sanity_observed_where_it_may_act_finds_what_every_step_finds(
        seed: int, dpo: bool, deepspeed: str | None) -> None:
    n = 600
    data = _sanity_columns(seed, n)
    steps = np.sort(np.random.default_rng(seed).choice(3 * n, n, replace=False)) + 1

    def values_at(i: int) -> dict[str, float]:
        return {k: float(v[i]) for k, (v, logged) in data.items() if logged[i]}

    every = sanity.SanityChecker(dpo=dpo, deepspeed_version=deepspeed)
    expected = [f for i in range(n) for f in every.observe(int(steps[i]), values_at(i))]
    some = sanity.SanityChecker(dpo=dpo, deepspeed_version=deepspeed)

    def column(name: str) -> tuple[np.ndarray, np.ndarray]:
        return data.get(name, (np.full(n, math.nan), np.zeros(n, dtype=bool)))

    act = some.may_act(column)
    got = [f for i in np.flatnonzero(act).tolist()
           for f in some.observe(int(steps[i]), values_at(i))]
    assert got == expected
    assert some._fired == every._fired
    if not data[c.LOSS_SCALE][1].any():
        assert act.sum() < n  # a shortcut: most steps left out where no scale is logged


def _trl_rows(seed: int, n: int, builder: RowsBuilder) -> dict[int, dict[str, float]]:
    """TRL keys logged per step, some keys dropped for a stretch, at single steps or several
    at once, a loss
    stuck at ln 3 for a while, NaN grad norms."""
    rng = np.random.default_rng(seed)
    keys = ["loss", "grad_norm", "reward", "reward_std", "entropy", "kl", "learning_rate",
            "epoch", "custom_timer"]
    gone = {k: np.zeros(n, dtype=bool) for k in keys}
    for _ in range(int(rng.integers(1, 6))):
        key = keys[int(rng.integers(len(keys)))]
        start = int(rng.integers(0, n))
        gone[key][start:start + int(rng.choice([1, 2, 50]))] = True
    for _ in range(int(rng.integers(5, 30))):  # several keys gone at one step
        at = int(rng.integers(0, n))
        for key in rng.choice(keys, int(rng.integers(2, 6)), replace=False):
            gone[str(key)][at] = True
    for key in keys:
        gone[key] |= rng.random(n) < float(rng.choice([0.0, 0.002, 0.3]))
    loss = 0.1 * rng.standard_normal(n)
    start = int(rng.integers(0, n))
    loss[start:start + 8] = sanity.LN3
    rows: dict[int, dict[str, float]] = {}
    for i in range(n):
        row = {k: float(loss[i]) if k == "loss" else float(rng.random())
               for k in keys if not gone[k][i]}
        if "grad_norm" in row and rng.random() < 0.01:
            row["grad_norm"] = math.nan
        builder.add(i + 1, row)
        rows[i + 1] = row
    return rows


@pytest.mark.parametrize("seed", range(8))
def test_a_log_by_column_is_diagnosed_as_its_rows_as_dicts(seed: int) -> None:
    builder = RowsBuilder()
    plain = _trl_rows(seed, 900, builder)
    by_column = builder.build()
    assert isinstance(by_column, ColumnRows)
    runs = [LoggedRun("log", "hf-trainer-state", "log", rows) for rows in (by_column, plain)]
    keymap = map_keys(runs[0].keys, None, None)
    assert keymap.framework == "trl"
    gaps = [findings._gaps(run, keymap) for run in runs]
    assert gaps[0] == gaps[1]
    found = [[f.to_json() for f in findings.diagnose(run).findings] for run in runs]
    assert repr(found[0]) == repr(found[1])
    if seed == 0:  # the generated log has something to find
        assert any(f["alert"] == "MetricNotLogged" for f in found[0]) or \
            any(f["alert"] == "LossAtLn3" for f in found[0])
