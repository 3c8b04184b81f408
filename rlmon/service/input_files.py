"""Files a user hands to rlmon (``diagnose``, ``replay``), opened with bounds checked first.

Input is hostile or careless: a symlink to ``/dev/zero``, a FIFO named like a log, a 2 MB zip
that inflates to gigabytes, a single line of a gigabyte. So a file is read only when it is a
regular file (checked by ``stat`` before opening and by ``fstat`` on the open descriptor, which
is opened non-blocking so a FIFO can never hang the open), its size is checked against the
caller's limit before anything is read, and lines are read in chunks, an over-long one counted
and skipped without ever being held whole. Every refusal is an :class:`InputFileError` naming
the file and what is wrong, for the caller to turn into its own clear error.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

__all__ = ["CHUNK", "InputFileError", "LineTooLong", "bounded_lines", "open_regular",
           "read_bounded", "regular_size"]

CHUNK = 1 << 16  # bytes read at a time from a stream of lines


class InputFileError(ValueError):
    """A file refused before (or while) reading it; the message names the file."""

    def __init__(self, path: str | Path, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = str(path)
        self.message = message


@dataclass(frozen=True, slots=True)
class LineTooLong:
    """A line longer than the limit: its size, counted while it was skipped in chunks."""

    size: int
    limit: int

    def __str__(self) -> str:
        return f"line of {self.size} bytes exceeds {self.limit} (skipped unread)"


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        return "a directory"
    return "not a regular file"


def regular_size(path: str | Path) -> int:
    """The size of a regular file (a symlink is followed); InputFileError for anything else."""
    try:
        info = os.stat(path)
    except OSError as exc:
        raise InputFileError(path, f"cannot read: {exc.strerror or exc}") from None
    if not stat.S_ISREG(info.st_mode):
        raise InputFileError(path, f"{_kind(info.st_mode)}, not a regular file: refused")
    return info.st_size


def _limit_text(limit: int) -> str:
    return f"{limit >> 20} MiB" if limit >= 1 << 20 else f"{limit} bytes"


def open_regular(path: str | Path, limit: int | None = None) -> BinaryIO:
    """``path`` opened for reading, once it is known to be a regular file of at most ``limit``
    bytes (checked again on the open descriptor, so a swap between the checks is caught)."""
    size = regular_size(path)
    if limit is not None and size > limit:
        raise InputFileError(path, f"{size} bytes, larger than the {_limit_text(limit)} "
                             "read: refused")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
                     | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise InputFileError(path, f"cannot read: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InputFileError(path, f"{_kind(info.st_mode)}, not a regular file: refused")
        if limit is not None and info.st_size > limit:
            raise InputFileError(path, f"{info.st_size} bytes, larger than the "
                                 f"{_limit_text(limit)} read: refused")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bounded(path: str | Path, limit: int) -> bytes:
    """The whole of a regular file of at most ``limit`` bytes (a file that grew past the limit
    while being read is refused too)."""
    with open_regular(path, limit) as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise InputFileError(path, f"grew past the {_limit_text(limit)} read while reading: "
                             "refused")
    return data


def bounded_lines(handle: BinaryIO, limit: int) -> Iterator[bytes | LineTooLong]:
    """The lines of a byte stream (without their newline), read ``CHUNK`` bytes at a time; a line
    over ``limit`` bytes is never held whole: what was read of it is dropped and its size
    counted to its end, then yielded as :class:`LineTooLong`."""
    read = getattr(handle, "read1", handle.read)  # a pipe gives what it has, not a full chunk
    parts: list[bytes] = []
    held = 0  # bytes in parts
    skipped: int | None = None  # size so far of an over-long line being skipped
    while True:
        chunk = read(CHUNK)
        if not chunk:
            break
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            piece = chunk[start:] if end < 0 else chunk[start:end]
            if skipped is not None:
                skipped += len(piece)
            elif held + len(piece) > limit:
                skipped, parts, held = held + len(piece), [], 0
            else:
                parts.append(piece)
                held += len(piece)
            if end < 0:
                break
            if skipped is not None:
                yield LineTooLong(skipped, limit)
                skipped = None
            else:
                yield b"".join(parts)
            parts, held = [], 0
            start = end + 1
    if skipped is not None:
        yield LineTooLong(skipped, limit)
    elif held:  # a last line without its newline (after a final newline there is no line)
        yield b"".join(parts)
