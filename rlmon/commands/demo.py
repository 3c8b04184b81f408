"""``rlmon demo``: the main job. A GRPO run on a local Ray cluster, watched by rlmon.

It starts Ray and the service, runs policy ranks (DP x CP), a rollout worker and a reward worker
as actors, injects a fault, shows the alert arriving (console, and any receiver configured with
``--config``) while ``/metrics`` serves live values, then prints a summary table and writes a plot.
``--replay`` replays the bundled example run instead, without Ray.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import urllib.request
from importlib import resources
from pathlib import Path
from typing import Any

from rlmon.commands.report import write_report
from rlmon.commands.trace import OPEN_HINT, write_trace
from rlmon.service.metrics import catalog
from rlmon.service.wording import counted

__all__ = ["register"]

# The curves of the summary table and the plot.
_KEY_METRICS = (
    catalog.IS_RATIO, catalog.LOGP_DIFF, catalog.KL, catalog.ENTROPY, catalog.CLIP_RATIO,
    catalog.REWARD,
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    # the workload's, not rlmon.actors.demo's (the same tuple): that one loads Ray and the
    # service, a second at every other command's start-up
    from rlmon.workload.grpo import FAULTS

    p = sub.add_parser("demo", help="run a GRPO job on Ray with a fault and watch rlmon catch it")
    p.add_argument("--steps", type=int, default=30, help="trainer steps (30)")
    p.add_argument("--dp", type=int, default=2, help="data-parallel policy ranks (2)")
    p.add_argument("--cp", type=int, default=2, help="context-parallel policy ranks (2)")
    p.add_argument("--fault", choices=FAULTS, default="stale_weights",
                   help="fault to inject: the rollout stops receiving weights (default), a "
                        "policy rank dies, the learning rate spikes 20x for 8 steps, or none "
                        "(a healthy run: no alert fires)")
    p.add_argument("--fault-step", type=int, default=3, help="step of the fault (3)")
    p.add_argument("--port", type=int, default=None,
                   help="port of the run page and /metrics (default 9464, or a free port when "
                   "it is taken; a port asked for that is taken is an error; 0: any free)")
    p.add_argument("--config", default=None, help="YAML settings (notifiers, routing)")
    p.add_argument("--state-dir", default=None,
                   help="where the demo's history store and outbox go (default: a fresh "
                   "temporary directory, kept for rlmon report and rlmon samples)")
    p.add_argument("--plot", default="rlmon-demo.png", help="PNG to write (rlmon-demo.png)")
    p.add_argument("--trace", default=None,
                   help="Perfetto trace of the run's step timelines to write (default: beside "
                   "the plot, rlmon-demo.pftrace)")
    p.add_argument("--report", default=None,
                   help="the run report to write (HTML: goodput, alerts and their cost; default: "
                   "beside the plot, rlmon-demo.html)")
    p.add_argument("--json", action="store_true",
                   help="step and alert lines as JSON (the replay contract) on stdout")
    p.add_argument("--replay", action="store_true",
                   help="replay the bundled example run instead (no Ray)")
    p.add_argument("--no-wait", action="store_true",
                   help="exit when the run is done (the default in a terminal keeps the run page "
                   "up until Ctrl-C; without a terminal on stdin the demo never waits)")
    p.set_defaults(func=_run)


def _replay(args: argparse.Namespace) -> int:
    from rlmon.commands.replay import print_json, print_table
    from rlmon.service.replay import replay

    data = resources.files("rlmon") / "data" / "example_run.jsonl"
    with data.open("rb") as handle:
        result = replay(handle)
    if args.json:
        print_json(result, sys.stdout, sys.stderr)
    else:
        print_table(result)
    return result.exit_code


def _demo_config(user_config: str | None, state_dir: Path) -> str:
    """The user's config, or one routing every alert to the console (the demo's receiver; no
    route to a Slack or PagerDuty that nobody configured)."""
    if user_config is not None:
        return user_config
    import yaml

    path = state_dir / "demo-config.yaml"
    path.write_text(yaml.safe_dump({
        "routing": {"critical": ["console"], "warning": ["console"]},
        "notifiers": {"console": {"enabled": True, "stream": "stdout"}},
    }))
    return str(path)


def _port_free(port: int) -> bool:
    import socket

    with socket.socket() as probe:
        # as the exporter binds (http.server sets SO_REUSEADDR): the TIME_WAIT connections of
        # the previous run's scrapes do not make the port taken
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _scrape(port: int, metric: str) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            body = r.read().decode()
    except OSError:
        return None
    for line in body.splitlines():
        if line.startswith(metric + "{"):
            return line
    return None


def _plot(path: str, steps: list[dict[str, Any]], alerts: list[dict[str, Any]],
          fault: str, fault_step: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(_KEY_METRICS), 1, figsize=(8, 2.0 * len(_KEY_METRICS)),
                             sharex=True)
    for ax, name in zip(axes, _KEY_METRICS, strict=True):
        points = [(s["step"], s["metrics"].get(name)) for s in steps]
        xs = [x for x, y in points if y is not None]
        ys = [y for _, y in points if y is not None]
        ax.plot(xs, ys, marker=".", label=name)
        ax.set_ylabel(name, fontsize=8)
        if fault != "none":
            ax.axvline(fault_step, color="grey", linestyle=":", label=f"fault: {fault}")
        for alert in alerts:
            if alert["state"] == "firing":
                ax.axvline(alert["step"], color="red", alpha=0.6, linestyle="--")
                if alert["metric"] == name:
                    ax.annotate(alert["alert"], (alert["step"], ys[-1] if ys else 0),
                                color="red", fontsize=8)
    axes[0].legend(loc="upper left", fontsize=7)
    axes[-1].set_xlabel("trainer step")
    fig.suptitle("rlmon demo: GRPO with DP x CP policy ranks (red: alerts firing)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _summary(steps: list[dict[str, Any]], alerts: list[dict[str, Any]], plot: str,
             metrics_line: str | None, elapsed: float) -> None:
    from rich.console import Console
    from rich.table import Table

    from rlmon.service.alerting.notify.render import transition_label

    console = Console(width=max(Console().width, 150))
    table = Table(title="rlmon demo: steps (actor ranks reporting; alerts of every role)")
    for col in ("step", "ranks", *(n.split("/", 1)[1] for n in _KEY_METRICS), "alerts"):
        table.add_column(col, justify="left" if col == "alerts" else "right")
    fired: dict[int, list[str]] = {}
    open_: set[tuple[str, str]] = set()
    for alert in alerts:
        key = (alert["role"], alert["alert"])
        # a firing while the incident is open: the same incident, now critical
        said = transition_label(alert["state"], bool(alert.get("ended_with_run")),
                                alert.get("handed_to") or "",
                                alert["severity"] if key in open_ else "")
        (open_.add if alert["state"] == "firing" else open_.discard)(key)
        fired.setdefault(alert["step"], []).append(f"{alert['alert']} {said}")
    by_step: dict[int, dict[str, Any]] = {}
    for s in steps:
        entry = by_step.setdefault(s["step"], {"metrics": {}, "ranks": ""})
        entry["metrics"].update(s["metrics"])
        if s["role"] == "actor":
            entry["ranks"] = f"{s['ranks_reporting']}/{s['ranks_expected']}"
    for step in sorted(by_step):
        entry = by_step[step]
        cells = [f"{entry['metrics'][n]:.4g}" if entry["metrics"].get(n) is not None else ""
                 for n in _KEY_METRICS]
        table.add_row(str(step), entry["ranks"], *cells, "; ".join(fired.get(step, [])))
    console.print(table)
    firing = sorted({a["alert"] for a in alerts if a["state"] == "firing"})
    console.print(f"alerts fired: {', '.join(firing) or 'none'}", highlight=False)
    if metrics_line:
        console.print(f"/metrics served live: {metrics_line}", highlight=False)
    console.print(f"plot written to {plot}; {len(by_step)} steps in {elapsed:.1f} s",
                  highlight=False)


def _routes_to_console(config: str | None) -> bool:
    from rlmon.service.config import load_config

    settings = load_config(config)
    routes = settings.routing
    return settings.notifiers.console.enabled and "console" in routes.critical + routes.warning


def _wait_for_user(args: argparse.Namespace, page: str, out: Any) -> None:
    """In a terminal, keep the service (and its run page) up until Ctrl-C; never in a script."""
    if args.no_wait or not sys.stdin.isatty():
        return
    print(f"rlmon demo: the run page stays up at {page}; press Ctrl-C to stop", file=out,
          flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        print("", file=out)


def _run(args: argparse.Namespace) -> int:
    if args.replay:
        return _replay(args)
    os.environ.setdefault("RAY_DISABLE_USAGE_STATS", "1")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    from rlmon.actors.demo import DemoJob
    from rlmon.actors.runtime import RuntimeOptions, ensure_runtime, shutdown_runtime

    started = time.monotonic()
    out = sys.stderr if args.json else sys.stdout
    if args.port is None:  # the default gives way to a free port; a port asked for does not
        args.port = 9464
        if not _port_free(args.port):
            print(f"rlmon demo: port {args.port} is taken; serving the run page and /metrics on "
                  "a free port instead", file=out)
            args.port = 0
    elif args.port and not _port_free(args.port):
        print(f"rlmon demo: port {args.port} is taken (--port); free it, or leave --port out "
              "to take a free one", file=sys.stderr)
        return 2
    namespace = "rlmon-demo"
    state_dir = Path(args.state_dir) if args.state_dir else Path(tempfile.mkdtemp(
        prefix="rlmon-demo-"))
    state_dir.mkdir(parents=True, exist_ok=True)
    ray.init(num_cpus=2, include_dashboard=False, namespace=namespace,
             log_to_driver=not args.json, configure_logging=False)
    code = 0
    try:
        opts = RuntimeOptions(config=_demo_config(args.config, state_dir),
                              state_dir=str(state_dir), port=args.port, host="127.0.0.1",
                              deadline_s=3.0)
        service = ensure_runtime(namespace, opts)
        layout = ray.get(service.layout.remote())
        port = layout["port"]
        fault = ("no fault" if args.fault == "none"
                 else f"fault {args.fault!r} at step {args.fault_step}")
        run = f"grpo-demo-{int(time.time())}"
        page = f"http://127.0.0.1:{port}/#/run/{run}"
        print(f"rlmon demo: service up, the run page at {page} (live metrics at "
              f"http://127.0.0.1:{port}/metrics); GRPO DP={args.dp} x CP={args.cp}, "
              f"{args.steps} steps, {fault}", file=out, flush=True)
        # the console notifier prints each alert; the demo says it itself only when the
        # user's config sends none there
        echo = not _routes_to_console(opts.config)
        seen = {"n": 0}
        metric_name = catalog.get(catalog.IS_RATIO).prometheus_name
        live: dict[str, str | None] = {"line": None}

        def on_step(step: int) -> None:
            count, events = ray.get(service.recent_events.remote(seen["n"]))
            seen["n"] = count
            for e in events if echo else ():
                value = "null" if e.value is None else f"{e.value:.4g}"
                print(f"ALERT {e.state.upper()} {e.alert} [{e.severity}] run={e.run} "
                      f"role={e.role} step={e.step} {e.metric}={value}", file=out, flush=True)
            line = _scrape(port, metric_name)
            if line is not None:
                live["line"] = line

        job = DemoJob(namespace, run, args.steps, args.dp, args.cp, args.fault,
                      args.fault_step, opts)
        result = job.execute(on_step)
        # the last steps finalize (or time out at the deadline for a dead rank), then report
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            steps = ray.get(service.steps.remote(run))
            if {s["step"] for s in steps if s["role"] == "actor"} >= set(range(args.steps)):
                break
            time.sleep(0.1)
        # the ranks closed their Reporters: the run reads finished (its report and page say
        # so) once the service has judged their closing heartbeats
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            states = ray.get(service.run_states.remote(run))
            if states and all(s["state"] not in ("running", "slow") for s in states):
                break
            time.sleep(0.1)
        on_step(args.steps)
        steps = ray.get(service.steps.remote(run))
        # with how each closing ended, for the summary (the run's end is no recovery)
        alerts = ray.get(service.alerts.remote(run, cost=True))
        if args.json:  # the replay contract's lines
            for s in steps:
                print(json.dumps(s))
            for a in ray.get(service.alerts.remote(run)):
                print(json.dumps(a))
        _plot(args.plot, [s for s in steps if s["role"] in ("actor", "reward")], alerts,
              args.fault, args.fault_step)
        if not args.json:
            _summary(steps, alerts, args.plot, live["line"], time.monotonic() - started)
        trace = args.trace or str(Path(args.plot).with_suffix(".pftrace"))
        written = write_trace(state_dir / "history.sqlite", run, trace)
        if written is not None:  # every rank's spans of every step, with the alerts
            print(f"trace written to {trace} ({written}): {OPEN_HINT}",
                  file=sys.stderr if args.json else out, flush=True)
        report = args.report or str(Path(args.plot).with_suffix(".html"))
        made = write_report(state_dir / "history.sqlite", run, report)
        # a share, not GPU-seconds: "goodput 0.07 of 31 GPU-seconds" read as 0.07 s of 31
        print(f"report written to {report}: goodput {100 * made.goodput_ratio:.1f} % of "
              f"{made.gpu_hours * 3600:.4g} GPU-seconds, {counted(len(made.alerts), 'alert')} with their "
              f"cost (rlmon report {run} --state-dir {state_dir})",
              file=sys.stderr if args.json else out, flush=True)
        # the alert each fault is shown by, and how many steps after the fault it fires
        expected = {"stale_weights": ("ISRatioStale", 10), "dead_rank": ("RankMissing", 0),
                    "lr_spike": ("ClipRatioHigh", 2)}
        if args.fault in expected:
            want, after = expected[args.fault]
            if not any(a["alert"] == want for a in alerts):
                # Not a failure: a short run may end before the fault has grown large enough.
                print(f"rlmon demo: {want} did not fire within {args.steps} steps (with the "
                      f"default workload it fires about {after} steps after the fault)",
                      file=sys.stderr)
        if not result["flushed"]:
            print("rlmon demo: some reporters could not flush", file=sys.stderr)
            code = 1
        _wait_for_user(args, page, out)
    finally:
        shutdown_runtime(namespace, timeout=10.0)
        ray.shutdown()
    return code
