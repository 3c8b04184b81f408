"""The console notifier: one line per alert, for `rlmon replay --alerts-to console` and debugging."""

from __future__ import annotations

import sys
from typing import IO, Any

from rlmon.service.notify.message import Delivery

__all__ = ["ConsoleNotifier"]


class ConsoleNotifier:
    name = "console"
    min_interval = 0.0

    def __init__(self, stream: IO[str] | None = None) -> None:
        self._stream = stream

    def send(self, body: dict[str, Any]) -> Delivery:
        out = self._stream or sys.stderr
        for alert in body.get("alerts", []):
            line = alert.get("text", "")
            check = alert.get("what_to_check")
            if check and alert.get("state") == "firing":
                line += f"\n    what to check: {check}"
            out.write(line + "\n")
        if body.get("dashboard"):
            out.write(f"    dashboard: {body['dashboard']}\n")
        out.flush()
        return Delivery.accepted()
