"""The walk of a call through the service, traced: how often control comes back to one module
from the others it calls (the "returns to the core" of docs/design.md, "The spine").

Counted with :func:`sys.setprofile`: a Python-level function of another module returning to a
frame of the watched module is one return to it; calls into C (a lock, ``isinstance``) are not
rooms and are not counted.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

__all__ = ["Walk", "walk"]


@dataclass
class Walk:
    """What one call did: ``returns`` to the watched module, the ``rooms`` (modules) it called
    directly, in order of first call, and every module of the package ``entered``."""

    returns: int = 0
    rooms: list[str] = field(default_factory=list)
    entered: set[str] = field(default_factory=set)


def _module(frame: FrameType, root: Path) -> str | None:
    """The rlmon module ``frame`` runs in (None: outside rlmon)."""
    path = Path(frame.f_code.co_filename)
    try:
        parts = path.resolve().relative_to(root).with_suffix("").parts
    except ValueError:
        return None
    return ".".join(("rlmon", *parts))


def walk(module_file: str, call: Callable[[], Any]) -> Walk:
    """Trace ``call()``; ``module_file`` is the watched module's ``__file__`` (a module of
    rlmon: only rlmon's modules count as rooms)."""
    import rlmon

    watched = Path(module_file).resolve()
    root = Path(rlmon.__file__).resolve().parent
    seen = Walk()

    def profile(frame: FrameType, event: str, _arg: Any) -> None:
        caller = frame.f_back
        if caller is None or Path(caller.f_code.co_filename).resolve() != watched:
            if event == "call" and (name := _module(frame, root)) is not None:
                seen.entered.add(name)
            return
        if Path(frame.f_code.co_filename).resolve() == watched:
            return
        name = _module(frame, root)
        if name is None:
            return
        if event == "call":
            seen.entered.add(name)
            if name not in seen.rooms:
                seen.rooms.append(name)
        elif event == "return":
            seen.returns += 1

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return seen
