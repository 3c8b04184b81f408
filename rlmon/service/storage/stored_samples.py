"""Stored worst samples: a step's ranked-metric items as the history store keeps them, and the
few that ride along in an alert's notifications.

What is kept is bounded: at most k (<= 64) items per metric and step (the form's bound), at most
``payload_bytes`` bytes of payload text per metric and step (the items past the budget keep their
score and id, their text is cut; counted), and the newest steps per (run, role) (retention). A
notification carries :data:`NOTIFY_ITEMS` items with their text cut to :data:`NOTIFY_CHARS`
characters, and says which command prints the rest.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlmon.service.metrics.nonfinite import NONFINITE_VALUES
from rlmon.service.metrics.ranked_forms import Sample, json_score

__all__ = [
    "NOTIFY_CHARS",
    "NOTIFY_ITEMS",
    "StepSamples",
    "bound_payloads",
    "command_for",
    "items_from_json",
    "items_to_json",
    "notify_items",
]

NOTIFY_ITEMS = 3  # samples in a notification: enough to see the pattern, short enough to page
NOTIFY_CHARS = 200  # characters of each one's payload there


def bound_payloads(items: Sequence[Sample], budget: int) -> tuple[tuple[Sample, ...], int]:
    """The items with their payload text within ``budget`` UTF-8 bytes in all (best first keep
    theirs; the one that crosses is cut at a character boundary, the rest lose it); and how
    many payloads were cut."""
    out: list[Sample] = []
    left, cut = budget, 0
    for score, ident, payload in items:
        size = len(payload.encode("utf-8", "replace"))
        if size > left:
            payload = payload.encode("utf-8", "replace")[:left].decode("utf-8", "ignore")
            cut += 1
            size = left
        left -= size
        out.append((score, ident, payload))
    return tuple(out), cut


def _number(value: Any) -> float:
    if isinstance(value, str):
        return NONFINITE_VALUES[value]
    return float(value)


def items_to_json(items: Sequence[Sample]) -> list[dict[str, Any]]:
    return [{"score": json_score(s), "id": i, "payload": p} for s, i, p in items]


def items_from_json(data: Sequence[Mapping[str, Any]]) -> tuple[Sample, ...]:
    return tuple((_number(d["score"]), str(d["id"]), str(d.get("payload", ""))) for d in data)


def notify_items(items: Sequence[Sample]) -> tuple[Sample, ...]:
    """The first few items, payloads cut for a notification (an ellipsis says so)."""
    return tuple((s, i, p if len(p) <= NOTIFY_CHARS else p[:NOTIFY_CHARS - 1] + "…")
                 for s, i, p in items[:NOTIFY_ITEMS])


def command_for(run: str, role: str, step: int, alert: str = "",
                state_dir: str | None = None) -> str:
    """The command that prints every stored sample behind a notification (``state_dir``: the
    service's, named so the command finds its history store wherever the service keeps it)."""
    where = f"--alert {shlex.quote(alert)}" if alert else f"--step {step}"
    store = f" --state-dir {shlex.quote(state_dir)}" if state_dir else ""
    return f"rlmon samples {shlex.quote(run)} --role {role} {where}{store}"


@dataclass(frozen=True, slots=True)
class StepSamples:
    """One sample metric's stored items at one step (``cut``: payloads cut to the budget)."""

    run: str
    role: str
    attempt: int
    step: int
    metric: str
    items: tuple[Sample, ...]
    cut: int = 0

    def to_json(self) -> dict[str, Any]:
        line: dict[str, Any] = {"type": "samples", "run": self.run, "role": self.role,
                                "step": self.step, "metric": self.metric,
                                "items": items_to_json(self.items)}
        if self.attempt:
            line["attempt"] = self.attempt
        if self.cut:
            line["payloads_cut"] = self.cut
        return line
