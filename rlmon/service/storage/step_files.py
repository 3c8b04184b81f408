"""A run's step table (:mod:`rlmon.service.storage.step_table`) written out a page at a time:
CSV with the standard library, Arrow record batches and Parquet with pyarrow (the ``export``
extra).

CSV keeps values exact as Python writes floats (the shortest text that reads back to the same
float64), ``nan``, ``inf`` and ``-inf`` as such, and an empty cell where the step did not report
the metric. Parquet and Arrow keep float64 values, NaN and null apart; each page is a row group.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rlmon.service.storage.step_table import StepPage, StepTable

__all__ = ["arrow_batches", "arrow_schema", "need_pyarrow", "write_csv", "write_parquet"]


def need_pyarrow() -> Any:
    """pyarrow, or an ImportError that says which extra brings it."""
    try:
        import pyarrow
    except ImportError:
        raise ImportError("Parquet, Arrow tables and DataFrames need the export extra: "
                          "pip install 'rlmon[export]' (pandas, pyarrow)") from None
    return pyarrow


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, float) else str(value)


def write_csv(table: StepTable, path: str | Path) -> int:
    """Write the table as CSV (a header row, then one row per step); returns the rows."""
    rows = 0
    with open(path, "w", newline="", encoding="utf-8") as handle:
        out = csv.writer(handle)
        out.writerow(table.columns)
        for page in table.pages():
            columns = [*page.meta.values(), *page.metrics.values()]
            out.writerows([_cell(v) for v in row] for row in zip(*columns, strict=True))
            rows += len(page)
    return rows


def arrow_schema(table: StepTable) -> Any:
    pa = need_pyarrow()
    return pa.schema([
        ("run", pa.string()), ("role", pa.string()), ("attempt", pa.int64()),
        ("step", pa.int64()), ("time", pa.float64()), ("complete", pa.bool_()),
        ("ranks_expected", pa.int64()), ("ranks_reporting", pa.int64()),
        *[(name, pa.float64()) for name in table.metrics()],
    ])


def _batch(page: StepPage, schema: Any) -> Any:
    pa = need_pyarrow()
    arrays = [pa.array(values, type=schema.field(name).type)
              for name, values in [*page.meta.items(), *page.metrics.items()]]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def arrow_batches(table: StepTable) -> Iterator[Any]:
    """The table as Arrow record batches, one per page."""
    schema = arrow_schema(table)
    for page in table.pages():
        yield _batch(page, schema)


def write_parquet(table: StepTable, path: str | Path) -> int:
    """Write the table as Parquet (a row group per page); returns the rows."""
    need_pyarrow()
    import pyarrow.parquet as pq

    schema = arrow_schema(table)
    rows = 0
    with pq.ParquetWriter(str(path), schema) as writer:
        for page in table.pages():
            writer.write_batch(_batch(page, schema))
            rows += len(page)
    return rows
