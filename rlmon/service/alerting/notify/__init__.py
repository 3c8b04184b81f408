"""Alert delivery: routing, notifiers (Slack, PagerDuty, webhook, console) and the durable outbox."""

from rlmon.service.alerting.notify.dispatcher import Dispatcher, DispatchStats
from rlmon.service.alerting.notify.factory import build_dispatcher, build_notifiers, open_outbox
from rlmon.service.alerting.notify.message import Delivery, Notification, Notifier
from rlmon.service.alerting.notify.outbox import Backoff, Outbox, OutboxCounters

__all__ = [
    "Backoff",
    "Delivery",
    "DispatchStats",
    "Dispatcher",
    "Notification",
    "Notifier",
    "Outbox",
    "OutboxCounters",
    "build_dispatcher",
    "build_notifiers",
    "open_outbox",
]
