"""Keep secrets out of logs, errors, outbox rows and exported labels.

A Slack webhook URL *is* its credential and client libraries happily put URLs into exception
messages, so every string that leaves the notifier path goes through a :class:`Redactor` first.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

__all__ = ["MASK", "WATCHED_LOGGERS", "RedactingFilter", "Redactor", "install_redaction"]

MASK = "***"
_MIN_SECRET = 4  # masking a 1-3 character "secret" would shred ordinary text


class Redactor:
    """Replaces every known secret value (and its URL path and query, for webhook URLs) with
    ``***``."""

    __slots__ = ("_needles",)

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        needles: set[str] = set()
        for secret in secrets:
            if not secret or len(secret) < _MIN_SECRET:
                continue
            needles.add(secret)
            # urllib/httpx errors often quote only the path of a URL (/services/T0/B0/xyz), or
            # only its query (a generic webhook's ?api_key=...)
            _scheme, sep, rest = secret.partition("://")
            if sep and "/" in rest:
                path = rest[rest.index("/"):]
                if len(path) >= 8:
                    needles.add(path)
            if sep and "?" in rest:
                query = rest[rest.index("?") + 1:]
                if len(query) >= 8:
                    needles.add(query)
        # longest first, so a URL is masked whole before its path is
        self._needles = tuple(sorted(needles, key=len, reverse=True))

    def __call__(self, text: str) -> str:
        for needle in self._needles:
            if needle in text:
                text = text.replace(needle, MASK)
        return text

    def __bool__(self) -> bool:
        return bool(self._needles)


class RedactingFilter(logging.Filter):
    """A logging filter that redacts the formatted message (args included) of every record."""

    def __init__(self, redactor: Redactor) -> None:
        super().__init__()
        self.redactor = redactor

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = self.redactor(message)
        if clean != message or record.args:
            record.msg, record.args = clean, None
        if record.exc_info and record.exc_info[1] is not None:
            text = logging.Formatter().formatException(record.exc_info)
            record.exc_info, record.exc_text = None, self.redactor(text)
        return True


# Client libraries that log request URLs or bodies (slack_sdk at DEBUG logs the webhook URL).
WATCHED_LOGGERS: tuple[str, ...] = ("slack_sdk", "pagerduty", "httpx", "httpcore", "urllib3")

_FILTER = RedactingFilter(Redactor())
_SECRETS: set[str] = set()
_INSTALL = threading.Lock()


def install_redaction(secrets: Iterable[str]) -> RedactingFilter:
    """Redact ``secrets`` in every log record of this process that reaches a root handler or the
    client libraries' loggers (and their existing children).

    One shared filter; calling again adds secrets and attaches it to handlers added since.
    """
    with _INSTALL:
        _SECRETS.update(s for s in secrets if s)
        _FILTER.redactor = Redactor(_SECRETS)
        loggers = [logging.getLogger(name) for name in WATCHED_LOGGERS]
        for name in list(logging.Logger.manager.loggerDict):
            if any(name.startswith(prefix + ".") for prefix in WATCHED_LOGGERS):
                loggers.append(logging.getLogger(name))
        for logger in loggers:
            if _FILTER not in logger.filters:
                logger.addFilter(_FILTER)
        for handler in logging.getLogger().handlers:
            if _FILTER not in handler.filters:
                handler.addFilter(_FILTER)
    return _FILTER
