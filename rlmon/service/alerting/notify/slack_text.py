"""Text for Slack: what a run, a rule or a metric name carries is shown, never obeyed.

Slack reads ``<...>`` in a message's ``text`` and in ``mrkdwn`` blocks as a control sequence: a
mention of everyone (``<!channel>``, ``<!here>``), of a user or a group (``<@U123>``,
``<!subteam^S1>``) or a link whose text hides its target (``<https://evil.example|the run>``).
Its documented escaping is ``&``, ``<`` and ``>`` as entities (:func:`mrkdwn`). A backtick would
open or close a code span and let what follows be read as text (a URL made a link), so it is
replaced by a look-alike that closes nothing; a code span's content also has its line breaks
folded (:func:`code`). A link
rlmon writes has its target's ``|``, ``<`` and ``>`` percent-encoded (:func:`link`). Every piece
of a Slack body that did not come from rlmon's own words goes through one of these functions.
"""

from __future__ import annotations

import re

__all__ = ["code", "link", "mrkdwn", "own_words"]

_BACKTICK_LOOKALIKE = "\u02cb"  # MODIFIER LETTER GRAVE ACCENT: looks like ` and closes nothing
_SPACES = re.compile(r"\s+")


def mrkdwn(text: str) -> str:
    """Plain text for a ``mrkdwn`` field or a message's ``text``: no mention, link, command or
    code span."""
    return (text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace("`", _BACKTICK_LOOKALIKE))


def own_words(text: str) -> str:
    """rlmon's own text (a remedy from the catalog, which writes its keys as code spans):
    entities only, its backticks kept."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def code(text: str) -> str:
    """``text`` as one inline code span, delimiters included, that nothing in it can close."""
    inner = _SPACES.sub(" ", mrkdwn(text)).strip()
    return f"`{inner or ' '}`"


def link(url: str, label: str) -> str:
    """A link rlmon writes: the target cannot end the link early, the label is plain text."""
    target = url.replace("|", "%7C").replace("<", "%3C").replace(">", "%3E")
    return f"<{target}|{mrkdwn(label).replace('|', '¦')}>"
