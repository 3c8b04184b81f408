"""What a reader hands on: one run's logged values per step, as the writer wrote them."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from rlmon.service.contract.records import MAX_STEP, ContractError, check_integer
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.diagnose.columns import ColumnRows
from rlmon.service.diagnose.run_settings import RunSettings, Segment

__all__ = ["LogError", "LoggedRun", "ReadProblem", "checked_step", "run_name", "to_float"]

_NAME_BAD = re.compile(r"[^A-Za-z0-9_.:-]+")


class LogError(Exception):
    """A file cannot be read as the log it should be; the message says what was expected."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


@dataclass(frozen=True, slots=True)
class ReadProblem:
    """A file (or part of one) that could not be read; what could be read is still diagnosed."""

    path: str
    message: str

    def to_json(self) -> dict[str, str]:
        return {"type": "error", "file": self.path, "error": self.message}


@dataclass(frozen=True, slots=True)
class LoggedRun:
    """One run's values: ``rows[step][key]`` as logged (NaN and Inf kept as floats).

    ``framework`` is set when the writer itself says which framework wrote it (verl's file
    logger); ``records`` holds steps rlmon aggregated itself (its own files), whose names are
    canonical already. ``notes`` says how the format spells things the reader had to interpret;
    ``packages`` the package versions the run recorded (W&B keeps the job's requirements), which
    the sanity layer reads (a DeepSpeed with the NaN grad-norm bug); ``segments`` the settings
    each stretch of the run was written with (one per resumed process where the format says).
    """

    source: str
    format: str
    name: str
    rows: Mapping[int, Mapping[str, float]] = field(default_factory=dict)
    framework: str | None = None
    records: tuple[StepRecord, ...] = ()
    problems: tuple[ReadProblem, ...] = ()
    notes: tuple[str, ...] = ()
    packages: Mapping[str, str] = field(default_factory=dict)  # as the run recorded them
    segments: tuple[Segment, ...] = ()
    run_id: str = ""  # the tracker's id, shared by a resumed run's files (W&B)
    # unix seconds each step was written at, where the format keeps it apart from the values
    # (TensorBoard's event wall times; W&B keeps _timestamp among them)
    times: Mapping[int, float] = field(default_factory=dict)

    @property
    def settings(self) -> RunSettings:
        """The settings of the run's last segment (none known: all None)."""
        return self.segments[-1].settings if self.segments else RunSettings()

    @property
    def steps(self) -> int:
        return len(self.records) if self.records else len(self.rows)

    @property
    def keys(self) -> list[str]:
        if isinstance(self.rows, ColumnRows):
            return self.rows.columns
        seen: dict[str, None] = {}
        for values in self.rows.values():
            seen.update(dict.fromkeys(values))
        for record in self.records:
            seen.update(dict.fromkeys(record.metrics))
        return list(seen)


def run_name(text: str) -> str:
    """A contract-valid run name (``[A-Za-z0-9_.:-]``, at most 128 characters) from a label."""
    name = _NAME_BAD.sub("-", text).strip("-") or "run"
    return name[-128:]


def to_float(value: object) -> float | None:
    """A logged scalar as a float; None for what is not a number (text, a table, a bool)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        special = {"nan": math.nan, "inf": math.inf, "infinity": math.inf,
                   "-inf": -math.inf, "-infinity": -math.inf}
        if text.lower() in special:
            return special[text.lower()]
        try:
            return float(text)
        except ValueError:
            return None
    return None


def checked_step(value: object) -> int | str:
    """A logged step as the contract takes one (an integer from 0 to 2^53 - 1, an integral
    float too), else what is wrong with it: a negative step or one of 1e29 is refused, not
    diagnosed (it cannot be plotted, nor ordered with the others)."""
    if isinstance(value, float) and not value.is_integer():
        return f"must be an integer, got {value!r}"
    try:
        return check_integer(value, "step", low=0, high=MAX_STEP)
    except ContractError as exc:
        return str(exc).removeprefix("step: ")
