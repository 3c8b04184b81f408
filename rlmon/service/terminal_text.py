"""Text for a terminal: what a run, a log or a key name carries is shown, never obeyed.

A foreign key name can hold escape sequences (a hyperlink to another site, a cleared screen,
text hidden by a colour or a carriage return), Unicode bidirectional overrides that reorder what
follows, or undecodable bytes. :func:`visible` writes every such character as its Python escape
(``\\x1b``, ``\\u202e``), keeping only newline and tab; it is the one escaping for terminal
output, used by the commands that print foreign names (``diagnose``, ``report``, ``diff``):
through :func:`visible_output` for their plain writes and :func:`terminal_console` for rich.
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterator
from typing import IO, Any

__all__ = ["VisibleStream", "terminal_console", "visible", "visible_output"]

# C0 (but tab and newline), DEL and C1; zero-width and bidirectional formatting characters; the
# line and paragraph separators; lone surrogates (undecodable bytes); the BOM and specials
_HIDDEN = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e"
                     "\u2060-\u206f\ud800-\udfff\ufeff\ufff9-\ufffb]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: str) -> str:
    """``text`` with every control or invisible formatting character written as its escape."""
    return _HIDDEN.sub(_escape, text)


class VisibleStream:
    """A text stream that writes what it is given through :func:`visible`."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        self.stream.write(visible(text))
        return len(text)

    def __getattr__(self, name: str) -> Any:  # flush, isatty, fileno, encoding ...
        return getattr(self.stream, name)


@contextlib.contextmanager
def visible_output() -> Iterator[None]:
    """``sys.stdout`` and ``sys.stderr`` escaped while a command prints."""
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = VisibleStream(out), VisibleStream(err)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err


def terminal_console(**options: Any) -> Any:
    """A rich ``Console`` whose printed strings are escaped before its markup is read (its own
    styles still reach the terminal), writing to the real standard output."""
    from rich.console import Console

    class _VisibleConsole(Console):
        def render_str(self, text: str, **kwargs: Any) -> Any:
            return super().render_str(visible(text), **kwargs)

    stdout = sys.stdout
    while isinstance(stdout, VisibleStream):
        stdout = stdout.stream
    return _VisibleConsole(file=stdout, **options)
