"""A run's metadata as an integration knows it (framework, algorithm, parallel layout, loss
reduction): sent by the training process, shown as ``rlmon_run_info`` and checked by the
framework-settings checklist."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

__all__ = ["MAX_TAGS", "RunInfo", "check_tags"]

MAX_TAGS = 32
_MAX_TAG = 64


def check_tags(tags: Any) -> tuple[str, ...]:
    """A run's tags (``RunInfo.tags``): up to 32 distinct printable strings of 1 to 64
    characters, none with a comma (the ``tags`` label joins them with commas), in their order;
    else a ValueError naming the offending one."""
    if isinstance(tags, str) or not isinstance(tags, Sequence | set | frozenset):
        raise ValueError(f"RunInfo.tags: a list of strings, got {tags!r:.80}")
    out: list[str] = []
    for tag in tags:
        if not isinstance(tag, str) or not 1 <= len(tag) <= _MAX_TAG or "," in tag \
                or not tag.isprintable() or tag != tag.strip():
            raise ValueError(f"RunInfo.tags: {tag!r:.80} is not a tag (1 to {_MAX_TAG} "
                             "printable characters, no comma, no space at either end)")
        if tag not in out:
            out.append(tag)
    if len(out) > MAX_TAGS:
        raise ValueError(f"RunInfo.tags: {len(out)} tags, at most {MAX_TAGS}")
    return tuple(out)


@dataclass(frozen=True, slots=True)
class RunInfo:
    """A run's metadata for ``rlmon_run_info`` (whatever the integration knows; blanks allowed).

    ``tags``: the user's own words for the run (``Reporter.set_run_info(tags=["baseline"])``),
    shown and filtered in the run page's runs table; the label joins them with commas."""

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
    tags: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "tags", check_tags(self.tags))

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
            out[f.name] = "" if value is None else ",".join(value) if isinstance(
                value, tuple) else str(value).lower() if isinstance(value, bool) else str(value)
        return out
