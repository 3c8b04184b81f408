"""What a Reporter refused or cut, counted, with its last error; each kind of refusal said once.

Both of the Reporter's threads add to one tally: the training thread when a held tensor was
modified before its fold, the sender thread when a statistic does not fit its step or the
aggregator refuses a message. Nothing is refused in silence: it is counted here, named in
``last_error`` and logged the first time it happens.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

__all__ = ["Tally"]

log = logging.getLogger(__name__)

SAY_AT_MOST = 100  # distinct refusals logged per Reporter (each once); later ones are counted


class Tally:
    """One Reporter's running counts of refusals and cuts, and its last error."""

    __slots__ = ("_said", "last_error", "payloads_cut", "rejected", "role", "run")

    def __init__(self, run: str, role: str) -> None:
        self.run, self.role = run, role  # named in what is logged
        self.rejected = 0  # statistics refused after recording (record_tensor, record_many)
        # Sample payloads cut to MAX_PAYLOAD_BYTES (after the privacy hook `redact`).
        self.payloads_cut = 0
        self.last_error: str | None = None
        self._said: set[str] = set()  # refusals already logged (each is said once)

    def refuse(self, names: Sequence[str], why: str) -> None:
        """Count statistics refused for ``why`` (the first one named in ``last_error``)."""
        self.rejected += len(names)
        self.last_error = f"{names[0]}: {why}"
        self.say_once(self.last_error, "rlmon: %s/%s: %d statistic(s) refused, e.g. %s: %s",
                      self.run, self.role, len(names), names[0], why)

    def say_once(self, refusal: str, message: str, *args: Any) -> None:
        """Log a refusal the first time it happens (not every step), up to SAY_AT_MOST kinds."""
        if refusal not in self._said and len(self._said) < SAY_AT_MOST:
            self._said.add(refusal)
            log.warning(message, *args)
