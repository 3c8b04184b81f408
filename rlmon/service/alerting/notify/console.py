"""The console notifier: one line per alert, for `rlmon replay --alerts-to console` and debugging."""

from __future__ import annotations

import sys
import threading
from collections import deque
from typing import IO, Any

from rlmon.service.alerting.notify.message import Delivery

__all__ = ["ConsoleBuffer", "ConsoleNotifier"]


class ConsoleBuffer:
    """A stream that keeps console lines for another process to print (bounded; the oldest go,
    counted in ``lost``). The embedded service writes its alerts here and the process that
    started it prints them on its own console: Ray's forwarding of actor output lags, and a job
    that ends right after a step would lose the last lines."""

    def __init__(self, limit: int = 10_000) -> None:
        self._lines: deque[str] = deque()
        self._partial = ""
        self._lock = threading.Lock()
        self.limit, self.lost = limit, 0

    def write(self, text: str) -> int:
        with self._lock:
            *done, self._partial = (self._partial + text).split("\n")
            self._lines.extend(done)
            while len(self._lines) > self.limit:
                self._lines.popleft()
                self.lost += 1
        return len(text)

    def flush(self) -> None:
        pass

    def take(self) -> list[str]:
        """Every complete line written since the last call (each line is taken once)."""
        with self._lock:
            lines = list(self._lines)
            self._lines.clear()
        return lines


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
            change = alert.get("what_to_change")
            if change:
                fw = alert.get("framework")
                line += f"\n    what to change{f' ({fw})' if fw else ''}: {change}"
            if alert.get("first_moved"):
                line += f"\n    what moved first: {alert['first_moved']}"
            if alert.get("alert_url"):
                line += f"\n    rlmon: {alert['alert_url']}"
            if alert.get("stop"):
                line += f"\n    {alert['stop']}"
            samples = alert.get("worst_samples")
            if samples:
                line += f"\n    worst samples ({samples['metric']}):"
                for n, item in enumerate(samples["items"], 1):
                    text = " ".join(str(item.get("payload", "")).split())
                    score = item["score"]  # a number, or "NaN"/"Infinity" as JSON has none
                    shown = f"{score:.4g}" if isinstance(score, int | float) else str(score)
                    line += f"\n      {n}. {item['id']}  {shown}" + (f"  {text}" if text else "")
                line += f"\n    all of them: {samples['more']}"
            out.write(line + "\n")
        if body.get("run_url"):
            out.write(f"    run page: {body['run_url']}\n")
        if body.get("dashboard"):
            out.write(f"    dashboard: {body['dashboard']}\n")
        out.flush()
        return Delivery.accepted()
