"""``rlmon dashboards build|push``: write the Grafana dashboards, or upload them to a Grafana."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("dashboards", help="build the Grafana dashboards or push them to Grafana")
    dsub = p.add_subparsers(dest="dashboards_command", required=True, metavar="ACTION")
    build = dsub.add_parser("build", help="write dashboards/*.json and the Helm chart's copies")
    build.add_argument("--root", default=".", help="project root (default: current directory)")
    build.add_argument("--check", action="store_true", help="exit 1 when a file is stale")
    build.set_defaults(func=_build)
    push = dsub.add_parser("push", help="upload the dashboards to Grafana (upsert by uid)")
    push.add_argument("--url", required=True, help="Grafana base URL, e.g. http://grafana:3000")
    push.add_argument("--token", default=os.environ.get("GRAFANA_TOKEN"),
                      help="service-account token (default: $GRAFANA_TOKEN)")
    push.add_argument("--folder", default="rlmon", help="folder title (default: rlmon)")
    push.add_argument("--folder-uid", default="rlmon", help="folder uid (default: rlmon)")
    push.add_argument("--timeout", type=float, default=10.0, help="HTTP timeout in seconds")
    push.set_defaults(func=_push)


def _build(args: argparse.Namespace) -> int:
    from rlmon.service.dashboards.artifacts import artifacts

    root = Path(args.root)
    stale = []
    for art in artifacts():
        path = root / art.path
        current = path.read_text(encoding="utf-8") if path.exists() else None
        new = art.expected(current)
        if new == current:
            continue
        if args.check:
            stale.append(art.path)
            print(f"stale: {art.path} (run `rlmon dashboards build`)", file=sys.stderr)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(new, encoding="utf-8")
        print(f"wrote {art.path}")
    return 1 if stale else 0


def _push(args: argparse.Namespace) -> int:
    from rlmon.service.dashboards.push import PushError, connect, push

    if not args.token:
        print("rlmon dashboards push: --token or $GRAFANA_TOKEN is required", file=sys.stderr)
        return 2
    try:
        results = push(connect(args.url, args.token, args.timeout), folder=args.folder,
                       folder_uid=args.folder_uid)
    except PushError as exc:
        print(f"rlmon dashboards push: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # connection refused, DNS, TLS
        print(f"rlmon dashboards push: cannot reach {args.url}: {exc}", file=sys.stderr)
        return 1
    for r in results:
        print(f"pushed {r.uid} version {r.version}: {args.url.rstrip('/')}{r.url}")
    return 0
