"""Keep secrets out of logs, errors, outbox rows and exported labels.

A Slack webhook URL *is* its credential and client libraries happily put URLs into exception
messages, so every string that leaves the notifier path goes through a :class:`Redactor` first.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

__all__ = ["MASK", "RedactingFilter", "Redactor"]

MASK = "***"
_MIN_SECRET = 4  # masking a 1-3 character "secret" would shred ordinary text


class Redactor:
    """Replaces every known secret value (and its URL path, for webhook URLs) with ``***``."""

    __slots__ = ("_needles",)

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        needles: set[str] = set()
        for secret in secrets:
            if not secret or len(secret) < _MIN_SECRET:
                continue
            needles.add(secret)
            # urllib/httpx errors often quote only the path of a URL (/services/T0/B0/xyz)
            _scheme, sep, rest = secret.partition("://")
            if sep and "/" in rest:
                path = rest[rest.index("/"):]
                if len(path) >= 8:
                    needles.add(path)
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
