"""Run the ``rlmon`` command in this process (the unit layer starts no subprocess): what
``python -m rlmon ARGS`` would print and return, through :func:`rlmon.cli.main`."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

from rlmon.cli import main

__all__ = ["run_rlmon"]


def _stream(data: bytes = b"") -> io.TextIOWrapper:
    return io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", newline=None,
                            write_through=True)


def run_rlmon(*args: Any, stdin: str | None = None,
              env: Mapping[str, str | None] | None = None) -> subprocess.CompletedProcess[str]:
    """``rlmon ARGS`` with ``stdin`` as its standard input and ``env`` in its environment (None
    unsets a name): its exit status (``main``'s return or a ``SystemExit``'s code, argparse's 2
    included) and its stdout and stderr as text. rlmon's loggers write to the captured stderr
    while it runs, as a child's would."""
    argv = [str(a) for a in args]
    out, err = _stream(), _stream()
    handler = logging.StreamHandler(err)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        with contextlib.ExitStack() as stack:
            for name, value in (env or {}).items():
                stack.callback(_restore, name, os.environ.get(name))
                _restore(name, value)
            stack.callback(setattr, sys, "stdin", sys.stdin)
            stack.callback(setattr, sys, "stdout", sys.stdout)
            stack.callback(setattr, sys, "stderr", sys.stderr)
            sys.stdin = _stream((stdin or "").encode())
            sys.stdout, sys.stderr = out, err
            try:
                code = main(argv)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                if exc.code is not None and not isinstance(exc.code, int):
                    print(exc.code, file=err)
    finally:
        root.removeHandler(handler)
    return subprocess.CompletedProcess(["rlmon", *argv], code, _text(out), _text(err))


def _restore(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def _text(stream: io.TextIOWrapper) -> str:
    stream.flush()
    buffer = stream.buffer
    assert isinstance(buffer, io.BytesIO)
    return buffer.getvalue().decode("utf-8", errors="replace")
