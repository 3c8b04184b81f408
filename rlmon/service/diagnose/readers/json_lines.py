"""JSON Lines as the trackers write them: one object per line, a bad line named and skipped.

Lines are read in chunks (:func:`rlmon.service.input_files.bounded_lines`): a line over
``MAX_LINE_BYTES`` is named and skipped without being held."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rlmon.service.diagnose.logged_run import LogError, ReadProblem
from rlmon.service.input_files import InputFileError, LineTooLong, bounded_lines, open_regular
from rlmon.service.json_input import TooDeep
from rlmon.service.json_input import loads as bounded_json

__all__ = ["MAX_LINE_BYTES", "first_object", "objects"]

MAX_LINE_BYTES = 16 << 20


def _lookahead(items: Iterator[bytes | LineTooLong],
               ) -> Iterator[tuple[bytes | LineTooLong, bool]]:
    """Each item and whether it is the last."""
    previous = next(items, None)
    for item in items:
        assert previous is not None
        yield previous, False
        previous = item
    if previous is not None:
        yield previous, True


def objects(path: Path, problems: list[ReadProblem]) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) of each line that holds a JSON object; the others go to
    ``problems`` (a last line cut short says the file is truncated)."""
    try:
        handle = open_regular(path)
    except InputFileError as exc:
        raise LogError(str(path), exc.message) from None
    with handle:
        lines = _lookahead(bounded_lines(handle, MAX_LINE_BYTES))
        for number, (raw, last) in enumerate(lines, start=1):
            if isinstance(raw, LineTooLong):
                problems.append(ReadProblem(f"{path}:{number}", str(raw)))
                continue
            if not raw.strip():
                continue
            try:
                value = bounded_json(raw)
            except TooDeep as exc:
                problems.append(ReadProblem(f"{path}:{number}", str(exc)))
                continue
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                what = "truncated (the last line is cut short)" if last else "not JSON"
                problems.append(ReadProblem(f"{path}:{number}", f"{what}: {exc}"))
                continue
            if not isinstance(value, dict):
                problems.append(ReadProblem(f"{path}:{number}", "expected a JSON object, got "
                                            f"{type(value).__name__}"))
                continue
            yield number, value


def first_object(path: Path) -> dict[str, Any] | None:
    """The first line's object (format detection), or None when it is not one."""
    try:
        with open_regular(path) as handle:
            for raw in bounded_lines(handle, MAX_LINE_BYTES):
                if isinstance(raw, LineTooLong):
                    return None
                if raw.strip():
                    value = bounded_json(raw)
                    return value if isinstance(value, dict) else None
    except (OSError, ValueError):
        return None
    return None
