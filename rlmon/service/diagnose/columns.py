"""A long log's values by column, and its steps as records built only when looked at.

A million-entry ``trainer_state.json`` held as a dict per step, then a step record (with its own
dict) per step, costs about 2 KB a step: gigabytes for values that are 8 bytes each. Here a run's
rows are kept as one array of steps and, per key, an array of values and a byte per step saying
whether the key was logged there (NaN is a value a run can log, so it cannot mark a gap): memory
follows the values kept. The rows still read as ``Mapping[int, Mapping[str, float]]`` (a row's
dict is built when asked), and :class:`RecordView` gives the step records the rules evaluate,
one at a time, in step order.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from operator import itemgetter
from typing import overload

import numpy as np

from rlmon.service.contract.step_record import StepRecord

__all__ = ["ColumnRows", "RecordView", "RowsBuilder"]

_BLOCK = 256  # rows collected as dicts before they go into the columns (a few hundred KB)


class ColumnRows(Mapping[int, Mapping[str, float]]):
    """Rows by step (ascending), stored by column."""

    def __init__(self, steps: array[int], values: dict[str, array[float]],
                 present: dict[str, bytearray]) -> None:
        self._steps = steps
        self._values = values
        self._present = present

    @property
    def columns(self) -> list[str]:
        """The keys, in the order they were first logged."""
        return list(self._values)

    def columns_of(self) -> Iterator[tuple[str, array[float], bytearray]]:
        """(key, values, logged) per key: the stored columns themselves."""
        for key, column in self._values.items():
            yield key, column, self._present[key]

    def logged(self, key: str) -> np.ndarray:
        """Per step, whether ``key`` was logged there (all False for a key never logged)."""
        present = self._present.get(key)
        if present is None:
            return np.zeros(len(self._steps), dtype=bool)
        return np.frombuffer(present, dtype=np.uint8).astype(bool)

    def step_at(self, index: int) -> int:
        return self._steps[index]

    def row(self, index: int) -> dict[str, float]:
        return {key: column[index] for key, column in self._values.items()
                if self._present[key][index]}

    def index_after(self, step: int) -> int:
        """The index of the first row whose step is greater than ``step``."""
        return bisect_right(self._steps, step)

    def __getitem__(self, step: int) -> Mapping[str, float]:
        index = bisect_left(self._steps, step)
        if index == len(self._steps) or self._steps[index] != step:
            raise KeyError(step)
        return self.row(index)

    def __iter__(self) -> Iterator[int]:
        return iter(self._steps)

    def __len__(self) -> int:
        return len(self._steps)

    def rows(self) -> Iterator[tuple[int, dict[str, float]]]:
        """(step, row) in step order, each row built as it is reached."""
        for index, step in enumerate(self._steps):
            yield step, self.row(index)


class RowsBuilder:
    """Collects rows as a reader meets them; rows of one step merge (a later value of a key
    replaces an earlier one). Steps met in ascending order are kept as dicts a block at a time,
    then written into the columns a key at a time (a list per key, not a loop over every key
    at every step); a step met after a later one is kept aside and merged in at :meth:`build`."""

    def __init__(self) -> None:
        self._steps: array[int] = array("q")
        self._values: dict[str, array[float]] = {}
        self._present: dict[str, bytearray] = {}
        self._last: int | None = None  # the greatest step met
        self._block_steps: list[int] = []  # the steps not yet in columns (the last included)
        self._block: list[dict[str, float]] = []
        self._late: dict[int, dict[str, float]] = defaultdict(dict)

    @property
    def steps(self) -> int:
        """Steps met so far."""
        return len(self._steps) + len(self._block_steps) + len(self._late)

    def add(self, step: int, values: Mapping[str, float]) -> None:
        if step == self._last and self._block:
            self._block[-1].update(values)
        elif self._last is None or step > self._last:
            # the last step stays in the block until a later one comes: it may go on
            if len(self._block) >= _BLOCK:
                self._flush()
            self._block_steps.append(step)
            self._block.append(dict(values))
            self._last = step
        else:
            self._late[step].update(values)

    def _flush(self) -> None:
        block = self._block
        if not block:
            return
        size = len(self._steps)
        count = len(block)
        self._steps.extend(self._block_steps)
        if not set().union(*block) <= self._values.keys():
            for row in block:
                for key in row:
                    if key not in self._values:  # in the order first logged
                        self._values[key] = array("d", [math.nan]) * size
                        self._present[key] = bytearray(size)
        keys = list(self._values)
        if len(keys) > 1 and all(len(row) == len(keys) for row in block):
            # every row holds every key (the common case): the columns by one transpose
            logged = b"\x01" * count
            by_key = zip(*map(itemgetter(*keys), block), strict=True)
            for key, column_values in zip(keys, by_key, strict=True):
                self._values[key].extend(column_values)
                self._present[key].extend(logged)
            self._block_steps, self._block = [], []
            return
        for key, column in self._values.items():
            got = [row.get(key) for row in block]
            if None in got:  # values are floats: None marks a step without the key
                column.extend([math.nan if v is None else v for v in got])
                self._present[key].extend([v is not None for v in got])
            else:
                column.extend(got)  # type: ignore[arg-type]
                self._present[key].extend(b"\x01" * count)
        self._block_steps, self._block = [], []

    def build(self) -> Mapping[int, Mapping[str, float]]:
        """The rows; a log whose steps went back (rare: a reader's file order) is merged into
        plain dicts, sorted."""
        self._flush()
        rows = ColumnRows(self._steps, self._values, self._present)
        if not self._late:
            return rows
        merged: dict[int, dict[str, float]] = {step: dict(row) for step, row in rows.rows()}
        for step, values in self._late.items():
            merged.setdefault(step, {}).update(values)
        return dict(sorted(merged.items()))


class RecordView(Sequence[StepRecord]):
    """A log's steps as step records under the mapped names (one stream), each built when it is
    looked at; iteration is in step order."""

    def __init__(self, rows: ColumnRows, names: Mapping[str, str], run: str, role: str) -> None:
        self._rows = rows
        self._names = names
        self._run = run
        self._role = role

    def _record(self, index: int) -> StepRecord:
        names = self._names
        return StepRecord(run=self._run, role=self._role, step=self._rows.step_at(index),
                          complete=True, ranks_expected=1, ranks_reporting=1, missing_ranks=(),
                          metrics={names[k]: v for k, v in self._rows.row(index).items()
                                   if k in names})

    def index_after(self, step: int) -> int:
        """The index of the first record whose step is greater than ``step``."""
        return self._rows.index_after(step)

    @property
    def run(self) -> str:
        return self._run

    @property
    def role(self) -> str:
        return self._role

    @property
    def names(self) -> list[str]:
        """The mapped names of the keys logged, sorted."""
        return sorted({name for key in self._rows.columns if (name := self._names.get(key))})

    def record(self, index: int) -> StepRecord:
        return self._record(index)

    def steps(self) -> np.ndarray:
        """The records' steps, as an array."""
        return np.fromiter(self._rows, dtype=np.int64, count=len(self._rows))

    def column(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(values, present) of the metric ``name`` over the records, as arrays: the values
        share the column's memory (a step whose keys map to one name holds the last)."""
        size = len(self._rows)
        values = np.full(size, np.nan)
        present = np.zeros(size, dtype=bool)
        for key, column, logged in self._rows.columns_of():
            if self._names.get(key) != name:
                continue
            here = np.frombuffer(logged, dtype=np.uint8).astype(bool)
            values = np.where(here, np.frombuffer(column, dtype=np.float64), values) \
                if present.any() else np.frombuffer(column, dtype=np.float64)
            present |= here
        return values, present

    @overload
    def __getitem__(self, index: int) -> StepRecord: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[StepRecord]: ...

    def __getitem__(self, index: int | slice) -> StepRecord | Sequence[StepRecord]:
        if isinstance(index, slice):
            return [self._record(i) for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        return self._record(index)

    def __iter__(self) -> Iterator[StepRecord]:
        for index in range(len(self)):
            yield self._record(index)

    def __len__(self) -> int:
        return len(self._rows)
