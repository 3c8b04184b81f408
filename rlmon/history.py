"""A run's history for notebooks: the runs a history store holds, and a run's steps as a pandas
DataFrame or an Arrow table (the ``export`` extra: pandas, pyarrow).

    import rlmon.history as h
    h.runs()                              # the runs, latest first
    df = h.steps("grpo-7b", role="actor")  # one row per (role, attempt, step), a column a metric

``state_dir`` is the service's state directory (default: ``$RLMON_STATE_DIR``, else the embedded
service's, as for ``rlmon samples``); ``store`` names a ``history.sqlite`` file instead. Values
are the stored float64s exactly; in the Arrow table a metric a step did not report is null and a
reported NaN is NaN (a DataFrame shows both as NaN unless ``dtype_backend="pyarrow"``). A long
run is read a page at a time (:func:`batches`), so memory follows the result, not the store.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from rlmon.service.storage.step_files import arrow_batches, arrow_schema, need_pyarrow
from rlmon.service.storage.step_table import StepTable, stored_runs

__all__ = ["arrow", "batches", "runs", "steps", "store_path"]


def store_path(state_dir: str | Path | None = None, namespace: str = "rlmon",
               store: str | Path | None = None) -> Path:
    """The history store file: ``store``, else ``<state_dir>/history.sqlite`` (the default state
    directory when None)."""
    if store is not None:
        return Path(store)
    from rlmon.actors.runtime import RuntimeOptions  # imports no Ray

    state = RuntimeOptions(state_dir=str(state_dir) if state_dir is not None else None)
    return Path(state.resolved_state_dir(namespace)) / "history.sqlite"


def _table(run: str, role: str | None, state_dir: str | Path | None, namespace: str,
           store: str | Path | None) -> StepTable:
    path = store_path(state_dir, namespace, store)
    table = StepTable(path, run, role)
    if not table.steps():
        known = [r["run"] for r in stored_runs(path)]
        raise KeyError(f"no steps of run {run!r}" + (f" role {role!r}" if role else "")
                       + f" in {path} (its runs: {', '.join(known[:10]) or 'none'})")
    return table


def runs(state_dir: str | Path | None = None, *, namespace: str = "rlmon",
         store: str | Path | None = None) -> list[dict[str, Any]]:
    """The runs the store holds, the latest first: each one's roles, attempts, steps stored,
    first and last step, and the unix times of its first and last step."""
    return stored_runs(store_path(state_dir, namespace, store))


def batches(run: str, role: str | None = None, state_dir: str | Path | None = None, *,
            namespace: str = "rlmon", store: str | Path | None = None) -> Iterator[Any]:
    """A run's steps as Arrow record batches, one page (10,000 steps) at a time."""
    return arrow_batches(_table(run, role, state_dir, namespace, store))


def arrow(run: str, role: str | None = None, state_dir: str | Path | None = None, *,
          namespace: str = "rlmon", store: str | Path | None = None) -> Any:
    """A run's steps as one ``pyarrow.Table``."""
    pa = need_pyarrow()
    table = _table(run, role, state_dir, namespace, store)
    return pa.Table.from_batches(list(arrow_batches(table)), schema=arrow_schema(table))


def steps(run: str, role: str | None = None, state_dir: str | Path | None = None, *,
          namespace: str = "rlmon", store: str | Path | None = None,
          dtype_backend: Literal["numpy", "pyarrow"] = "numpy") -> Any:
    """A run's steps as a ``pandas.DataFrame``: one row per (role, attempt, step), the columns
    run, role, attempt, step, time, complete, ranks_expected, ranks_reporting, then a column a
    metric. ``dtype_backend="pyarrow"`` keeps null (not reported) apart from NaN."""
    try:
        import pandas as pd
    except ImportError:
        raise ImportError("DataFrames need the export extra: pip install 'rlmon[export]'"
                          ) from None
    table = arrow(run, role, state_dir, namespace=namespace, store=store)
    if dtype_backend == "pyarrow":
        return table.to_pandas(types_mapper=pd.ArrowDtype)
    return table.to_pandas()
