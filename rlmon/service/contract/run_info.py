"""A run's metadata as an integration knows it (framework, algorithm, parallel layout, loss
reduction): sent by the training process, shown as ``rlmon_run_info`` and checked by the
framework-settings checklist."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

__all__ = ["RunInfo"]


@dataclass(frozen=True, slots=True)
class RunInfo:
    """A run's metadata for ``rlmon_run_info`` (whatever the integration knows; blanks allowed)."""

    framework: str = ""
    framework_version: str = ""
    algorithm: str = ""
    loss_reduction: str = ""
    dp: int | None = None
    cp: int | None = None
    tp: int | None = None
    pp: int | None = None
    grad_accumulation: int | None = None
    zero_stage: int | None = None
    deepspeed_version: str = ""
    dpo: bool = False  # a preference run (DPO-style loss), whatever ``algorithm`` says

    @classmethod
    def from_fields(cls, values: Mapping[str, Any]) -> RunInfo:
        """A RunInfo from keyword fields; an unknown field is a TypeError naming it."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise TypeError(f"RunInfo: unknown field {unknown[0]!r} (fields: {sorted(known)})")
        return cls(**dict(values))

    def labels(self) -> dict[str, str]:
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = "" if value is None else (
                str(value).lower() if isinstance(value, bool) else str(value))
        return out
