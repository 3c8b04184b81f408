"""Torch helpers for the extras-venv tests. Import it after ``optional_import("torch")``: that
skips the module where torch is missing, before this import needs it."""

from __future__ import annotations

from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["OpCounter"]


class OpCounter(TorchDispatchMode):
    """Counts every ATen operation dispatched on this thread while active."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))
