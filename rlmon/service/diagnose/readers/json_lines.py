"""JSON Lines as the trackers write them: one object per line, a bad line named and skipped."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rlmon.service.diagnose.logged_run import LogError, ReadProblem

__all__ = ["first_object", "objects"]


def objects(path: Path, problems: list[ReadProblem]) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) of each line that holds a JSON object; the others go to
    ``problems`` (a last line cut short says the file is truncated)."""
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise LogError(str(path), f"cannot read: {exc.strerror or exc}") from None
    with handle:
        lines = handle.read().split(b"\n")
    last = len(lines) - (1 if lines and not lines[-1].strip() else 0)
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            value = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            what = "truncated (the last line is cut short)" if number == last else "not JSON"
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
        with path.open("rb") as handle:
            for raw in handle:
                if raw.strip():
                    value = json.loads(raw)
                    return value if isinstance(value, dict) else None
    except (OSError, ValueError):
        return None
    return None
