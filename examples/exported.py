"""A peek at what rlmon exported about a run, as Prometheus would scrape it (used by the examples).

The service publishes a step a few milliseconds after the aggregator finalized it, so this polls
``/metrics`` until the run's last step shows, then prints the run's step and alert lines.
"""

from __future__ import annotations

import time
import urllib.request

from rlmon.actors.runtime import metrics_url


def print_exported(run: str, role: str, last_step: int, timeout: float = 30.0) -> None:
    url = metrics_url()
    if url is None:
        print("rlmon: /metrics is not served by this process's runtime")
        return
    wanted = f'rlmon_step{{role="{role}",run="{run}"}} {float(last_step)}'
    deadline = time.monotonic() + timeout
    lines: list[str] = []
    while time.monotonic() < deadline and wanted not in lines:
        with urllib.request.urlopen(url, timeout=10) as page:
            lines = page.read().decode().splitlines()
    print(f"{url}:")
    print("\n".join(line for line in lines if f'run="{run}"' in line
                    and line.startswith(("rlmon_step{", "rlmon_alert_firing{"))))
