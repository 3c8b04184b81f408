"""A JSON object read a value at a time, so a long ``log_history`` never sits in memory whole.

A Hugging Face ``trainer_state.json`` of a million log entries is about 190 MB of text; parsed
at once it is the text, then every entry as a dict, then the rows built from them: gigabytes.
Here the file is read in chunks and each top-level value (and each element of an array the
caller walks) is decoded on its own by the standard library's decoder (which reads ``NaN`` and
``Infinity`` as Python's ``json`` does), so memory holds one chunk and one value. A single value
larger than ``max_value`` characters is refused, never buffered without end.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

__all__ = ["JsonStream", "JsonStreamError"]

_CHUNK = 1 << 20
_WHITESPACE = " \t\r\n"
_SPACE = re.compile(r"[ \t\r\n]*")
_NUMBER_CHARS = "0123456789.eE+-"
_NUMBER_TAIL = re.compile(r"[0-9.eE+-]*")
_DECODER = json.JSONDecoder()


# what raw_decode calls, without its wrapper (the C scanner; not in the type stubs)
_SCAN: Callable[[str, int], tuple[Any, int]] = _DECODER.scan_once  # type: ignore[attr-defined]


def _past(pattern: re.Pattern[str], text: str, pos: int) -> int:
    """Where a run of ``pattern`` (which matches the empty string) starting at ``pos`` ends."""
    found = pattern.match(text, pos)
    return found.end() if found else pos


class JsonStreamError(ValueError):
    """The text is not the JSON expected (truncated, malformed, a value beyond the bound)."""


class JsonStream:
    """Reads a JSON document from ``handle`` token by token where asked, value by value."""

    def __init__(self, handle: BinaryIO, max_value: int = 16 << 20) -> None:
        self._text = io.TextIOWrapper(handle, encoding="utf-8")
        self._buf = ""
        self._pos = 0
        self._eof = False
        self._consumed = 0  # characters before _buf
        self.max_value = max_value

    def close(self) -> None:
        self._text.close()

    def __enter__(self) -> JsonStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def offset(self) -> int:
        """Characters read so far (for messages)."""
        return self._consumed + self._pos

    def _fill(self) -> bool:
        if self._eof:
            return False
        try:
            more = self._text.read(_CHUNK)
        except UnicodeDecodeError as exc:
            raise JsonStreamError(f"not UTF-8 near character {self.offset}: {exc}") from None
        if not more:
            self._eof = True
            return False
        if self._pos:
            self._consumed += self._pos
            self._buf = self._buf[self._pos:]
            self._pos = 0
        self._buf += more
        return True

    def peek(self) -> str:
        """The next character that is not whitespace ('' at the end)."""
        while True:
            while self._pos < len(self._buf) and self._buf[self._pos] in _WHITESPACE:
                self._pos += 1
            if self._pos < len(self._buf):
                return self._buf[self._pos]
            if not self._fill():
                return ""

    def expect(self, char: str) -> None:
        found = self.peek()
        if found != char:
            raise JsonStreamError(f"expected {char!r} at character {self.offset}, found "
                                  + (repr(found) if found else "the end (truncated?)"))
        self._pos += 1

    def value(self) -> Any:
        """The next complete JSON value."""
        self.peek()
        while True:
            try:
                value, end = _DECODER.raw_decode(self._buf, self._pos)
            except json.JSONDecodeError as exc:
                if self._eof:
                    raise JsonStreamError(f"not complete JSON (truncated?): {exc.msg} at "
                                          f"character {self._consumed + exc.pos}") from None
                value, end = None, -1
            except RecursionError:
                raise JsonStreamError(f"nested too deeply at character {self.offset}") from None
            # a number at the buffer's end may go on in the next chunk ("1." or "1e" is not
            # one yet, though the decoder reads 1 from it)
            if end >= 0 and (self._eof or _past(_NUMBER_TAIL, self._buf, end) < len(self._buf)):
                self._pos = end
                return value
            if len(self._buf) - self._pos > self.max_value:
                raise JsonStreamError(f"a value at character {self.offset} is longer than "
                                      f"{self.max_value} characters: refused")
            if not self._fill():
                self._eof = True

    def object_items(self) -> Iterator[str]:
        """The keys of the object that starts here; after each key, the caller reads its value
        (``value()``, or ``array_items()`` to walk it)."""
        self.expect("{")
        if self.peek() == "}":
            self._pos += 1
            return
        while True:
            key = self.value()
            if not isinstance(key, str):
                raise JsonStreamError(f"expected an object key at character {self.offset}")
            self.expect(":")
            yield key
            if self.peek() == ",":
                self._pos += 1
                continue
            self.expect("}")
            return

    def array_items(self) -> Iterator[Any]:
        """The elements of the array that starts here, one decoded value at a time.

        A million elements make the per-element Python count: an element that decodes whole
        inside the buffer and is followed by ``,`` (or ``]``) in it is taken here without the
        calls around the decoder; anything else (a buffer's end, an error) goes the general
        way (:meth:`value`, :meth:`peek`, :meth:`expect`), which refills and words errors."""
        self.expect("[")
        if self.peek() == "]":
            self._pos += 1
            return
        scan = _SCAN
        while True:
            buf, pos = self._buf, self._pos
            try:
                value, end = scan(buf, pos)
            except (StopIteration, json.JSONDecodeError, RecursionError):
                end = -1
            if not 0 <= end < len(buf) or buf[end] in _NUMBER_CHARS:  # may go on: value()
                value = self.value()
                buf, end = self._buf, self._pos
            after = buf[end] if end < len(buf) else ""
            if after in _WHITESPACE and after:
                end = _past(_SPACE, buf, end)
                after = buf[end] if end < len(buf) else ""
            if after == ",":
                end += 1
                if end < len(buf) and buf[end] in _WHITESPACE:
                    end = _past(_SPACE, buf, end)
                self._pos = end
                yield value
                continue
            if after == "]":
                self._pos = end + 1
                yield value
                return
            self._pos = end
            yield value
            if self.peek() == ",":
                self._pos += 1
                continue
            self.expect("]")
            return
