"""``rlmon serve``: start or join a Ray cluster and run the service and aggregators until stopped.

SIGINT/SIGTERM trigger a graceful shutdown: aggregators finalize their open steps and deliver
them, the service drains its notification outbox, then the actors exit.

With ``--service-resource NAME`` the service actor (exporter, notifiers, outbox) requests one unit
of the custom Ray resource NAME, so it runs on the one node that offers it: in Kubernetes, the
rlmon pod itself joins the RayCluster with ``ray start --resources='{"NAME": 1}'``, and the service
lives where its config file, secrets, state volume, probes and Service are.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from typing import Any

from rlmon.service.wording import counted

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("serve", help="run the aggregator and service actors until interrupted")
    p.add_argument("--address", default=None,
                   help="Ray cluster: 'auto', 'ray://HOST:PORT', or omit to start a local one")
    p.add_argument("--namespace", default="rlmon", help="Ray namespace of the actors (rlmon)")
    p.add_argument("--config", default=None, help="YAML settings file (notifiers, routing, ...)")
    p.add_argument("--rules", default=None, help="YAML rule file (on top of the default pack)")
    p.add_argument("--port", type=int, default=None,
                   help="exporter port for /metrics, /healthz (default: exporter.port of the "
                   "config)")
    p.add_argument("--host", default=None,
                   help="exporter bind address (default: exporter.host of the config, 127.0.0.1; "
                   "0.0.0.0 serves every interface, unauthenticated: see docs/deploy.md)")
    p.add_argument("--service-resource", default=None, metavar="NAME",
                   help="run the service actor on the node offering this custom Ray resource "
                   "(the rlmon pod, which joins the cluster with ray start --resources)")
    p.add_argument("--state-dir", default=None,
                   help="directory for the history store, outbox and watermarks")
    p.add_argument("--shards", type=int, default=1, help="aggregator shards by (run, role)")
    p.add_argument("--deadline", type=float, default=None,
                   help="seconds a step waits for missing ranks (default: 3 step periods)")
    p.add_argument("--detached", action="store_true",
                   help="keep the actors running after this command exits")
    p.set_defaults(func=run_serve)


def exporter_address(args: argparse.Namespace, settings: Any) -> tuple[int, str]:
    """(port, host) of the exporter: the command line, else the config's ``exporter`` section."""
    port = args.port if args.port is not None else settings.exporter.port
    host = args.host if args.host is not None else settings.exporter.host
    return int(port), str(host)


def _absolute(path: str | None) -> str | None:
    # the service actor may run in another working directory
    return os.path.abspath(path) if path else None


def ray_join_env() -> str:
    """The environment that makes a script join this process's Ray: its address, and with
    Ray's token authentication on, where the script finds the token."""
    import ray

    words = [f"RAY_ADDRESS={ray.get_runtime_context().gcs_address}"]
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "token":
        words.append("RAY_AUTH_MODE=token")
        if os.environ.get("RAY_AUTH_TOKEN"):
            words.append("RAY_AUTH_TOKEN=<the token set here>")
        else:
            path = os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.join(
                os.path.expanduser("~"), ".ray", "auth_token")
            words.append(f"RAY_AUTH_TOKEN_PATH={path}")
    return " ".join(words)


def check_service_resource(resource: str) -> None:
    """Fail fast, with the command that fixes it, when no node offers ``resource``."""
    import ray

    offered = ray.cluster_resources().get(resource, 0.0)
    if offered < 1.0:
        raise RuntimeError(
            f"no Ray node offers the resource {resource!r}: start the rlmon node with "
            f"ray start --address=<head>:6379 --num-cpus=0 --resources="
            f"{json.dumps({resource: 1})!r}")


def run_serve(args: argparse.Namespace, stop: threading.Event | None = None) -> int:
    os.environ.setdefault("RAY_DISABLE_USAGE_STATS", "1")
    from rlmon.service.config import ConfigError, load_config
    from rlmon.service.redact import install_redaction

    try:
        settings = load_config(args.config)  # fail here, not inside an actor, on a bad config
    except ConfigError as exc:
        print(f"rlmon serve: {exc}", file=sys.stderr)
        return 2
    install_redaction(settings.secret_values())
    host = exporter_address(args, settings)[1]

    import ray

    from rlmon.actors.runtime import RuntimeOptions, ensure_runtime, shutdown_runtime

    init: dict[str, Any] = {"namespace": args.namespace, "include_dashboard": False}
    if args.address:
        init["address"] = args.address
    ray.init(**init)
    opts = RuntimeOptions(
        config=_absolute(args.config), rules=_absolute(args.rules),
        # no --port: the service takes the config's (or RLMON_PORT), and only the default
        # gives way to a free port when taken
        state_dir=_absolute(args.state_dir), port=args.port, host=host, shards=args.shards,
        detached=args.detached, deadline_s=args.deadline,
        service_resource=args.service_resource or None,
        # resolved here, once, from serve's file, environment and flags: the service actor may
        # run in a Ray worker that has none of serve's environment (--address)
        settings=settings,
    )
    try:
        if args.service_resource:
            check_service_resource(args.service_resource)
        service = ensure_runtime(args.namespace, opts)
        layout: Any = ray.get(service.layout.remote())
    except Exception as exc:
        print(f"rlmon serve: cannot start: {exc}", file=sys.stderr)
        ray.shutdown()
        return 1
    where = f" on the node offering {args.service_resource!r}" if args.service_resource else ""
    print(
        f"rlmon serve: namespace {args.namespace!r}, {counted(layout['shards'], 'aggregator shard')}, "
        f"service{where} with metrics on http://{host}:{layout['port']}/metrics "
        f"(health: /healthz; the run page: http://{host}:{layout['port']}/)",
        flush=True,
    )
    # a script's Reporter starts its own Ray unless told where this one is; RAY_ADDRESS=auto
    # would join the newest Ray on the machine, which may be another user's
    print(f"rlmon serve: training scripts report here when started with {ray_join_env()} "
          f"(Reporter namespace {args.namespace!r})", flush=True)
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
