"""``rlmon serve``: start or join a Ray cluster and run the service and aggregators until stopped.

SIGINT/SIGTERM trigger a graceful shutdown: aggregators finalize their open steps and deliver
them, the service drains its notification outbox, then the actors exit.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from typing import Any

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("serve", help="run the aggregator and service actors until interrupted")
    p.add_argument("--address", default=None,
                   help="Ray cluster: 'auto', 'ray://HOST:PORT', or omit to start a local one")
    p.add_argument("--namespace", default="rlmon", help="Ray namespace of the actors (rlmon)")
    p.add_argument("--config", default=None, help="YAML settings file (notifiers, routing, ...)")
    p.add_argument("--rules", default=None, help="YAML rule file (on top of the default pack)")
    p.add_argument("--port", type=int, default=9464, help="exporter port for /metrics, /healthz")
    p.add_argument("--host", default="0.0.0.0", help="exporter bind address (0.0.0.0)")
    p.add_argument("--state-dir", default=None,
                   help="directory for the history store, outbox and watermarks")
    p.add_argument("--shards", type=int, default=1, help="aggregator shards by (run, role)")
    p.add_argument("--deadline", type=float, default=None,
                   help="seconds a step waits for missing ranks (default: 3 step periods)")
    p.add_argument("--detached", action="store_true",
                   help="keep the actors running after this command exits")
    p.set_defaults(func=run_serve)


def run_serve(args: argparse.Namespace, stop: threading.Event | None = None) -> int:
    os.environ.setdefault("RAY_DISABLE_USAGE_STATS", "1")
    import ray

    from rlmon.actors.runtime import RuntimeOptions, ensure_runtime, shutdown_runtime

    init: dict[str, Any] = {"namespace": args.namespace, "include_dashboard": False}
    if args.address:
        init["address"] = args.address
    ray.init(**init)
    opts = RuntimeOptions(
        config=args.config, rules=args.rules, state_dir=args.state_dir, port=args.port,
        host=args.host, shards=args.shards, detached=args.detached, deadline_s=args.deadline,
    )
    try:
        service = ensure_runtime(args.namespace, opts)
        layout: Any = ray.get(service.layout.remote())
    except Exception as exc:
        print(f"rlmon serve: cannot start: {exc}", file=sys.stderr)
        ray.shutdown()
        return 1
    print(
        f"rlmon serve: namespace {args.namespace!r}, {layout['shards']} aggregator shard(s), "
        f"metrics on http://{args.host}:{layout['port']}/metrics (health: /healthz)",
        flush=True,
    )
    stop = stop or threading.Event()
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda *_: stop.set())
    try:
        while not stop.wait(1.0):
            pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        ok = True
        if not args.detached:
            ok = shutdown_runtime(args.namespace, timeout=10.0)
            print("rlmon serve: stopped" + ("" if ok else " (some deliveries pending)"),
                  flush=True)
        ray.shutdown()
    return 0 if ok else 1
