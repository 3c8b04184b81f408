"""What rlmon says on this process's stderr: where a service it started or joined can be found,
and the service's console alerts, relayed to the process that started it."""

from __future__ import annotations

import sys
import threading
from collections.abc import Mapping
from typing import Any

from rlmon.actors.runtime.connect import gcs_address
from rlmon.actors.runtime.held import PROCESS, Runtime, in_ray_worker, runtime_of
from rlmon.actors.runtime.no_auto_init import no_auto_init

__all__ = ["announce", "print_console", "relay_console", "say_service"]


def announce(runtime: Runtime, layout: Mapping[str, Any]) -> None:
    """Say once, in the process that started the service, where to look."""
    port = layout.get("port")
    where = (f"/metrics on http://{layout.get('host')}:{port}/metrics, the run page on "
             f"http://{layout.get('host')}:{port}/" if port is not None
             else "no /metrics (exporter disabled)")
    moved = f" (port {layout['wanted_port']} was taken)" if layout.get("port_moved") else ""
    alerts = ", ".join(layout.get("destinations") or ["nowhere"])
    print(f"rlmon: service started in namespace {runtime.namespace!r}: {where}{moved}; "
          f"alerts to {alerts}; state in {layout.get('state_dir')}; Ray at {gcs_address()}",
          file=sys.stderr, flush=True)


_SAID_SERVICE: set[str] = set()


def say_service(namespace: str, layout: Mapping[str, Any]) -> None:
    """A driver that joined a service another process started says once where its metrics go
    (RAY_ADDRESS=auto joins the newest Ray on the machine: it may be another user's rlmon)."""
    if namespace in _SAID_SERVICE or layout.get("creator") == PROCESS or in_ray_worker():
        return
    _SAID_SERVICE.add(namespace)
    port = layout.get("port")
    page = (f"the run page on http://{layout.get('host')}:{port}/" if port is not None
            else "no run page (exporter disabled)")
    print(f"rlmon: reporting to the rlmon service in namespace {namespace!r} on the Ray at "
          f"{gcs_address()}: {page}; state in {layout.get('state_dir')}", file=sys.stderr,
          flush=True)


def print_console(service: Any, timeout: float = 10.0) -> None:
    """Print the console alerts the service holds."""
    import ray

    lines: list[str] = ray.get(service.take_console.remote(), timeout=timeout)
    if lines:
        print("\n".join(lines), file=sys.stderr, flush=True)


def relay_console(runtime: Runtime, period: float = 0.2) -> None:
    """Print the service's console alerts here, in the process that started it, while it runs."""
    import ray

    stop = threading.Event()
    while runtime_of(runtime.namespace) is runtime and not stop.wait(period):
        if not ray.is_initialized():
            return  # the job shut Ray down; nothing is left to relay from
        try:
            with no_auto_init():  # a shutdown between the check above and this call
                print_console(runtime.service)
        except Exception:  # the service restarting, or shut down under us: try again
            continue
