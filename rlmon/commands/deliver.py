"""``rlmon replay FILE --alerts-to ...``: deliver a replayed run's alerts through real notifiers.

Not a subcommand of its own: :mod:`rlmon.commands.replay` calls it. A fresh temporary outbox is
used, so replaying the same file twice sends twice (that is the point of a routing test), and the
service's own outbox is never touched.
"""

from __future__ import annotations

import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from rlmon.service.config import DESTINATIONS, ConfigError, RoutingConfig, load_config
from rlmon.service.replay import ReplayResult

__all__ = ["deliver_alerts", "parse_destinations", "replay_routing"]


def parse_destinations(text: str) -> list[str]:
    """``slack,pagerduty`` -> ["slack", "pagerduty"]; raises ValueError naming a bad one."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in DESTINATIONS]
    if bad or not names:
        raise ValueError(f"--alerts-to: unknown destination {bad[0] if bad else text!r}; "
                         f"choose from {', '.join(DESTINATIONS)}")
    return names


def replay_routing(routing: RoutingConfig, destinations: Sequence[str],
                   all_severities: bool = False) -> RoutingConfig:
    """The routing of a replay: the configured routes limited to ``destinations``; ``console``,
    when named, gets every alert (it is how one watches a replay), and ``all_severities`` sends
    every alert to every named destination."""
    chosen = list(destinations)
    if all_severities:
        return RoutingConfig.model_validate({"critical": chosen, "warning": chosen})

    def limit(route: list[str] | None) -> list[str] | None:
        if route is None:
            return None
        kept = [d for d in route if d in chosen and d != "console"]
        return kept + (["console"] if "console" in chosen else [])

    data = routing.model_dump()
    data["critical"], data["warning"] = limit(data["critical"]), limit(data["warning"])
    for override in data["runs"]:
        override["critical"], override["warning"] = (
            limit(override["critical"]), limit(override["warning"]))
    return RoutingConfig.model_validate(data)


def deliver_alerts(
    result: ReplayResult, destinations: Sequence[str], config: str | None,
    all_severities: bool = False, timeout: float = 120.0, err: IO[str] | None = None,
) -> int:
    """Route and deliver; returns 0 when everything routed was accepted, 1 otherwise."""
    from rlmon.service.alerting.notify import build_dispatcher, open_outbox
    from rlmon.service.redact import install_redaction

    err = err or sys.stderr
    try:
        settings = load_config(config)
    except ConfigError as exc:
        print(f"rlmon replay: {exc}", file=err)
        return 2
    settings.routing = replay_routing(settings.routing, destinations, all_severities)
    # a replay's steps arrive at once: grouping by time would merge a whole run into one
    # message; each step's alerts go as the step's message
    settings.notifiers.grouping = settings.notifiers.grouping.model_copy(update={"enabled": False})
    events = result.alerts
    with tempfile.TemporaryDirectory(prefix="rlmon-replay-") as tmp:
        outbox = open_outbox(settings, Path(tmp) / "outbox.sqlite")
        dispatcher = build_dispatcher(settings, outbox, only=destinations)
        install_redaction(settings.secret_values())  # client libraries log request URLs
        missing = [d for d in destinations if d not in dispatcher.notifiers]
        if missing:
            print(f"rlmon replay: {', '.join(missing)} not configured (set its URL or key: see "
                  "docs/alerting.md and docs/configuration.md)", file=err)
            outbox.close()
            return 2
        from rlmon.service.alerting.first_mover import explain_steps

        for record, step_events in explain_steps(result.steps):  # what moved first, too
            dispatcher.submit(step_events, finalized_at=record.finalized_at)
        drained = dispatcher.drain(timeout)
        stats = outbox.counters()
        outbox.close()
    print(f"rlmon replay: {len(events)} alert events -> {stats.sent} notifications delivered, "
          f"{stats.failed} failed, {stats.pending} undelivered"
          + ("" if drained else f" (gave up after {timeout:g}s)"), file=err)
    elsewhere = Counter(e.severity for e in events
                        if not settings.routing.destinations(e.run, e.severity))
    if elsewhere:
        noun = "event" if sum(elsewhere.values()) == 1 else "events"
        print("rlmon replay: " + ", ".join(f"{n} {severity}" for severity, n in
                                           sorted(elsewhere.items()))
              + f" alert {noun} routed to none of {', '.join(destinations)} by the config's "
              "routing; --all-severities sends every alert to them", file=err)
    return 0 if drained and stats.failed == 0 else 1
