"""Build the notifiers and the dispatcher that a :class:`Settings` describes."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from rlmon.service.alerting.notify.console import ConsoleNotifier
from rlmon.service.alerting.notify.dispatcher import Dispatcher
from rlmon.service.alerting.notify.message import Notifier
from rlmon.service.alerting.notify.outbox import Backoff, Outbox
from rlmon.service.config import Settings

__all__ = ["DEFAULT_OUTBOX", "build_dispatcher", "build_notifiers", "open_outbox", "outbox_path"]

DEFAULT_OUTBOX = "rlmon-outbox.sqlite"


def build_notifiers(
    settings: Settings, only: Collection[str] | None = None,
    transports: Mapping[str, Any] | None = None,
) -> list[Notifier]:
    """Every configured notifier (or those named in ``only``). ``transports`` maps a destination
    to an injected transport (httpx2 for PagerDuty), the seam tests use for loopback receivers."""
    n, redactor = settings.notifiers, settings.redactor()
    transports = transports or {}
    wanted = set(only) if only is not None else None
    out: list[Notifier] = []

    def want(name: str) -> bool:
        return wanted is None or name in wanted

    if want("slack") and n.slack.ready and n.slack.bot:
        from rlmon.service.alerting.notify.slack import SlackBotNotifier

        assert n.slack.bot_token is not None and n.slack.channel
        out.append(SlackBotNotifier(n.slack.bot_token.get_secret_value(), n.slack.channel,
                                    base_url=n.slack.api_url, timeout=n.slack.timeout_seconds,
                                    min_interval=n.slack.min_interval_seconds, redactor=redactor))
    elif want("slack") and n.slack.ready:
        from rlmon.service.alerting.notify.slack import SlackNotifier

        assert n.slack.webhook_url is not None
        out.append(SlackNotifier(n.slack.webhook_url.get_secret_value(),
                                 timeout=n.slack.timeout_seconds,
                                 min_interval=n.slack.min_interval_seconds, redactor=redactor))
    if want("pagerduty") and n.pagerduty.ready:
        from rlmon.service.alerting.notify.pagerduty import PagerDutyNotifier

        assert n.pagerduty.routing_key is not None
        out.append(PagerDutyNotifier(
            n.pagerduty.routing_key.get_secret_value(), base_url=n.pagerduty.base_url,
            timeout=n.pagerduty.timeout_seconds, min_interval=n.pagerduty.min_interval_seconds,
            transport=transports.get("pagerduty"), redactor=redactor,
        ))
    if want("webhook") and n.webhook.ready:
        from rlmon.service.alerting.notify.webhook import WebhookNotifier

        assert n.webhook.url is not None
        token = n.webhook.token.get_secret_value() if n.webhook.token is not None else None
        out.append(WebhookNotifier(n.webhook.url.get_secret_value(), token=token,
                                   timeout=n.webhook.timeout_seconds,
                                   min_interval=n.webhook.min_interval_seconds, redactor=redactor))
    if want("console") and n.console.enabled:
        import sys

        stream = transports.get("console") or (
            sys.stdout if n.console.stream == "stdout" else sys.stderr)
        out.append(ConsoleNotifier(stream))
    return out


def outbox_path(settings: Settings, state_dir: Path | None) -> str | Path:
    """Where the service keeps its outbox: ``outbox.path`` when set (a relative path lies under
    the state directory), else ``<state_dir>/outbox.sqlite``, else in memory."""
    configured = settings.outbox.path
    if configured is not None:
        path = Path(configured).expanduser()
        if not path.is_absolute() and state_dir is not None:
            path = state_dir / path
        path.parent.mkdir(parents=True, exist_ok=True)
        return path
    return state_dir / "outbox.sqlite" if state_dir is not None else ":memory:"


def open_outbox(settings: Settings, path: str | Path | None = None) -> Outbox:
    cfg = settings.outbox
    return Outbox(
        path if path is not None else (cfg.path or DEFAULT_OUTBOX),
        backoff=Backoff(cfg.backoff_initial_seconds, cfg.backoff_max_seconds, cfg.backoff_jitter),
        give_up_after=cfg.give_up_after_seconds, sent_memory=cfg.sent_memory,
    )


def build_dispatcher(
    settings: Settings, outbox: Outbox | None = None, only: Collection[str] | None = None,
    transports: Mapping[str, Any] | None = None, state_dir: Path | None = None,
) -> Dispatcher:
    """A dispatcher over the configured notifiers and the configured (or given) outbox;
    ``state_dir`` is the service's (where `rlmon samples` finds its history store)."""
    return Dispatcher(settings, outbox or open_outbox(settings),
                      build_notifiers(settings, only, transports),
                      state_dir=str(state_dir) if state_dir is not None else None)
