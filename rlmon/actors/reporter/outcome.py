"""How this process ends, and who it is: the ``outcome`` and ``process`` of a Reporter's heartbeats.

A crash must never read as a clean finish (docs/reporter.md, "How a process ends"). What each
ending leaves for rlmon to see, and where it is caught:

* an uncaught exception on the main thread reaches ``sys.excepthook`` before the exit flush
  closes the Reporters; one on another thread reaches ``threading.excepthook``. Both are chained
  (the hook found at install time is called after rlmon's note, never replaced), once per
  process. ``sys.last_value`` is the fallback when a hook installed later replaced rlmon's.
* ``with Reporter(...)`` left by an exception, and ``close()`` called in an ``except`` or
  ``finally`` block while one is in flight, see that exception itself.
* ``sys.exit(n)``: ``SystemExit`` never reaches ``sys.excepthook`` and CPython keeps the exit
  code in C, out of reach of the exit hooks. rlmon wraps ``sys.exit`` (the wrapper calls the
  one it replaced) and notes the code on the main thread; a later ``end_step`` clears it (the
  ``SystemExit`` was caught and the run went on). ``raise SystemExit(n)`` is seen only through
  a with-block or a ``close()`` in ``finally``; ``os._exit`` is never seen: the stream goes
  silent and the service's liveness tells frozen from gone.
* SIGTERM (a scheduler's preemption): a handler on the main thread, installed only over the
  default disposition or chained to a Python handler. Over the default it runs the exit flush
  (bounded by ``RLMON_EXIT_TIMEOUT``), restores the default and raises the signal again, so the
  process still dies of SIGTERM (status -15, 143 in a shell). A ``sys.exit`` called by the
  current SIGTERM handler (Ray's own, installed by ``ray.init`` on the main thread) is named
  SIGTERM too. SIGINT arrives as ``KeyboardInterrupt``.
* A driver that dies because a Ray actor raised (``ray.get`` raising ``RayTaskError``) carries
  the actor's exception: the type names both (``RayTaskError(ValueError)``), the message and the
  frames are the cause's.

The first failure noted wins: it is the cause; what follows (the exit it leads to) is its effect.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import signal
import socket
import sys
import threading
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any, NoReturn

from rlmon.service.contract.heartbeat import (
    MAX_OUTCOME_FRAMES,
    MAX_OUTCOME_MESSAGE,
    Outcome,
    OutcomeKind,
    ProcessId,
)

__all__ = ["describe", "exit_budget", "exit_flush", "install", "mark_raised", "note", "process_id",
           "process_outcome", "process_stage", "raised_in", "step_ended", "thread_outcome",
           "thread_stage"]

log = logging.getLogger(__name__)

_TERMINATING = ("SIGTERM", "SIGINT", "SIGHUP")
_RAISED_IN = "_rlmon_raised_in"  # the attribute an exception carries its spans in

Spans = tuple[tuple[str, int], ...]  # a Reporter's open spans: (name, perf ns at entry)
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


class _State:
    """The process's notes (one per process; a forked child starts afresh, see :func:`_mine`)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.hooked = False
        self.sigterm_hooked = False
        self.outcome: Outcome | None = None  # the process's first failure: the main thread's
        self.threads: dict[int, Outcome] = {}  # other threads' uncaught exceptions, by ident
        # where each failure was raised: its exception's marks (see mark_raised), by thread
        self.stage: dict[Any, dict[int, Spans]] = {}
        self.exit_code: int | None = None  # sys.exit(n != 0) on the main thread, not yet cleared
        self.previous: dict[str, Any] = {}  # the hooks and handler rlmon chains to
        # what a SIGTERM over the default disposition runs before dying of it (the runtime's exit
        # flush when Ray is used; every open Reporter's close otherwise)
        self.flush: Callable[[], None] | None = None
        self.process: ProcessId | None = None


_STATE = _State()


def _mine() -> _State:
    global _STATE
    if _STATE.pid != os.getpid():  # a fork: the parent's notes and Ray ids are not this process's
        fresh = _State()
        fresh.hooked, fresh.previous = _STATE.hooked, _STATE.previous
        fresh.sigterm_hooked, fresh.flush = _STATE.sigterm_hooked, _STATE.flush
        _STATE = fresh
    return _STATE


# -- describing an ending ------------------------------------------------------------------------

def _type_name(exc: BaseException) -> str:
    cls = type(exc)
    module = getattr(cls, "__module__", "") or ""
    return cls.__qualname__ if module in ("builtins", "__main__") else f"{module}.{cls.__qualname__}"


def _text(exc: BaseException, limit: int = MAX_OUTCOME_MESSAGE) -> str:
    try:
        text = str(exc)
    except Exception:  # a __str__ that raises must not cost the outcome
        text = f"<unprintable {type(exc).__name__}>"
    return text[:limit]


def _frames(tb: TracebackType | None) -> tuple[str, ...]:
    """The innermost frames, innermost last, as "file:line in function" (no source read)."""
    out: list[str] = []
    while tb is not None:
        code = tb.tb_frame.f_code
        out.append(f"{code.co_filename}:{tb.tb_lineno} in {code.co_name}")
        if len(out) > 4 * MAX_OUTCOME_FRAMES:
            del out[:-MAX_OUTCOME_FRAMES]
        tb = tb.tb_next
    return tuple(out[-MAX_OUTCOME_FRAMES:])


def _remote_cause(exc: BaseException) -> BaseException | None:
    """The exception a Ray task or actor raised, carried by the ``RayTaskError`` (or the
    ``RayActorError`` of an actor that died of one) that ``ray.get`` raised here."""
    cause = getattr(exc, "cause", None)
    for _ in range(3):  # an actor's death caused by a task error: the innermost user exception
        inner = getattr(cause, "cause", None)
        if not isinstance(inner, BaseException):
            break
        cause = inner
    return cause if isinstance(cause, BaseException) else None


def exit_code_of(code: object) -> int:
    """The process exit status ``SystemExit(code)`` leads to."""
    if code is None:
        return 0
    if isinstance(code, int) and not isinstance(code, bool):
        return code
    return 1  # any other object is printed and the status is 1


def describe(exc: BaseException) -> Outcome | None:
    """The outcome an exception ends a process with (None: a clean ``SystemExit(0)``)."""
    if isinstance(exc, SystemExit):
        code = exit_code_of(exc.code)
        return None if code == 0 else Outcome(OutcomeKind.EXIT, "SystemExit", _text(exc),
                                              _frames(exc.__traceback__), code)
    if isinstance(exc, KeyboardInterrupt):
        return Outcome(OutcomeKind.SIGNAL, "KeyboardInterrupt", "", _frames(exc.__traceback__),
                       signal="SIGINT")
    cause = _remote_cause(exc)
    if cause is not None:
        # the remote traceback, as text: RayTaskError keeps it in traceback_str, the class
        # ray.get raises (RayTaskError(ValueError)) only in its str
        where = getattr(exc, "traceback_str", "") or _text(exc, limit=1 << 20)
        remote = tuple(f"{f}:{line} in {fn}" for f, line, fn in _FRAME.findall(where))
        return Outcome(OutcomeKind.EXCEPTION, _type_name(exc), _text(cause),
                       remote[-MAX_OUTCOME_FRAMES:] or _frames(exc.__traceback__))
    return Outcome(OutcomeKind.EXCEPTION, _type_name(exc), _text(exc), _frames(exc.__traceback__))


def mark_raised(exc: BaseException, reporter: int, spans: Spans) -> None:
    """Mark ``exc`` with the spans of a Reporter (by id) open where it was raised: the innermost
    span it leaves marks it first. The mark travels with the exception itself, so one caught
    on the way is never taken for the one that ends the process, and nothing (no frame, no
    traceback) is kept alive by it."""
    try:
        marks = exc.__dict__.setdefault(_RAISED_IN, {})
    except AttributeError:  # an exception type without a __dict__: its stage goes unsaid
        return
    marks.setdefault(reporter, spans)


def raised_in(exc: BaseException | None) -> dict[int, Spans]:
    """The marks of :func:`mark_raised` on ``exc`` (empty: none)."""
    marks = getattr(exc, "__dict__", {}).get(_RAISED_IN) if exc is not None else None
    return marks if isinstance(marks, dict) else {}


def note(outcome: Outcome | None, thread: int | None = None,
         exc: BaseException | None = None) -> None:
    """Note how the process (or, with ``thread``, that thread) ended, by ``exc`` if an exception
    ended it; the first failure wins."""
    if outcome is None:
        return
    state = _mine()
    with state.lock:
        if thread is not None:
            if thread not in state.threads:
                state.threads[thread] = outcome
                state.stage[thread] = raised_in(exc)
        elif state.outcome is None:
            state.outcome = outcome
            state.stage[None] = raised_in(exc)


def step_ended() -> None:
    """A step ended after a ``sys.exit`` was noted: it was caught, the run went on."""
    if _STATE.exit_code is not None:
        _STATE.exit_code = None


def thread_outcome(thread: int | None) -> Outcome | None:
    """The uncaught exception that ended ``thread``, if one did."""
    return None if thread is None else _mine().threads.get(thread)


def thread_stage(thread: int | None) -> dict[int, Spans]:
    """Where the exception that ended ``thread`` was raised (marks by Reporter)."""
    return {} if thread is None else _mine().stage.get(thread, {})


def process_stage() -> dict[int, Spans]:
    """Where the exception :func:`process_outcome` tells of was raised (marks by Reporter)."""
    state = _mine()
    if state.outcome is not None:
        return state.stage.get(None, {})
    return raised_in(getattr(sys, "last_value", None)) if state.exit_code is None else {}


def process_outcome() -> Outcome | None:
    """How the process is ending, as far as it can be told now (None: nothing failed)."""
    state = _mine()
    if state.outcome is not None:
        return state.outcome
    if state.exit_code is not None:
        return Outcome(OutcomeKind.EXIT, "SystemExit", str(state.exit_code), (), state.exit_code)
    last = getattr(sys, "last_value", None)  # PyErr_Print sets it before any excepthook runs
    if isinstance(last, BaseException) and not hasattr(sys, "ps1") and not sys.flags.interactive:
        return describe(last)
    return None


# -- hooks -------------------------------------------------------------------------------------

def _sys_hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
    try:
        note(describe(value), exc=value)
    finally:
        previous = _STATE.previous.get("sys.excepthook") or sys.__excepthook__
        previous(kind, value, tb)


def _thread_hook(args: Any) -> None:
    try:
        if args.exc_value is not None and not isinstance(args.exc_value, SystemExit):
            thread = args.thread.ident if args.thread is not None else None
            if thread == threading.main_thread().ident:
                note(describe(args.exc_value), exc=args.exc_value)
            elif thread is not None:
                note(describe(args.exc_value), thread, args.exc_value)
    finally:
        previous = _STATE.previous.get("threading.excepthook") or threading.__excepthook__
        previous(args)


def _signal_name(frame: FrameType | None) -> str | None:
    """The signal whose current Python handler is ``frame``'s function, if any."""
    if frame is None:
        return None
    for name in _TERMINATING:
        handler = signal.getsignal(getattr(signal, name))
        if getattr(handler, "__code__", None) is frame.f_code:
            return name
    return None


def _exit(code: str | int | None = None) -> NoReturn:
    """``sys.exit`` that notes a failing code first (see the module's docstring)."""
    status = exit_code_of(code)
    if status != 0 and threading.current_thread() is threading.main_thread():
        called_by = _signal_name(sys._getframe(1))
        if called_by is not None:  # Ray's SIGTERM handler exits with the signal's number
            note(Outcome(OutcomeKind.SIGNAL, signal=called_by, exit_code=status))
        else:
            _mine().exit_code = status
    previous = _STATE.previous.get("sys.exit") or _original_exit
    previous(code)
    raise SystemExit(code)  # a sys.exit replaced before rlmon's that returned: what sys.exit does


_original_exit = sys.exit


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    note(Outcome(OutcomeKind.SIGNAL, signal="SIGTERM"))
    previous = _STATE.previous.get("SIGTERM")
    if callable(previous):
        previous(signum, frame)
        return
    # The default would kill the process now: say how it ends first (within the exit budget),
    # then die of the signal all the same, so a scheduler sees the status it expects. Ray's C++
    # failure handler (a driver's core worker) saw the signal first and armed an alarm that
    # aborts the process 3 s later, cutting the flush: the process dies of SIGTERM below anyway.
    signal.alarm(0)
    try:
        exit_flush()
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.raise_signal(signal.SIGTERM)


def exit_budget() -> float:
    """``RLMON_EXIT_TIMEOUT`` (60 s): the most time rlmon adds to the process's exit, and what a
    Reporter's ``close()`` waits for its steps by default."""
    return float(os.environ.get("RLMON_EXIT_TIMEOUT", "60"))


def exit_flush(flush: Callable[[], None] | None = None) -> None:
    """Set (with ``flush``) or run what a terminating signal runs before the process dies."""
    state = _mine()
    if flush is not None:
        state.flush = flush
        return
    if state.flush is not None:
        state.flush()
        return
    from rlmon.actors.reporter.sink import close_open_senders

    close_open_senders(timeout=exit_budget())


def _at_exit() -> None:
    try:
        exit_flush()
    except Exception as exc:  # never turn an exit into a traceback, but say it
        log.warning("rlmon: the exit flush failed: %s", exc)


def _register_exit_flush() -> None:
    """Reporters left open are closed at exit, whatever their sink (the runtime's flush when Ray
    is used, see :func:`exit_flush`): when the main thread ends, before ``atexit`` hooks."""
    register = getattr(threading, "_register_atexit", None)
    try:
        if register is None:
            raise RuntimeError("no threading._register_atexit")
        register(_at_exit)
    except RuntimeError:  # the interpreter's shutdown has begun
        atexit.register(_at_exit)


def install() -> None:
    """Chain the exception hooks and wrap ``sys.exit`` once per process; on the main thread,
    put the SIGTERM handler over the default (or a Python handler) once. Idempotent."""
    state = _mine()
    with state.lock:
        if not state.hooked:
            state.hooked = True
            state.previous["sys.excepthook"] = sys.excepthook
            sys.excepthook = _sys_hook
            state.previous["threading.excepthook"] = threading.excepthook
            threading.excepthook = _thread_hook
            state.previous["sys.exit"] = sys.exit
            sys.exit = _exit
            _register_exit_flush()
        if state.sigterm_hooked or threading.current_thread() is not threading.main_thread():
            return
        current = signal.getsignal(signal.SIGTERM)
        if current is _on_sigterm:
            state.sigterm_hooked = True
            return
        if current is not signal.SIG_DFL and not callable(current):
            return  # ignored, or set outside Python: the process does not die of it here
        state.sigterm_hooked = True
        state.previous["SIGTERM"] = current
        signal.signal(signal.SIGTERM, _on_sigterm)


# -- who sends -----------------------------------------------------------------------------------

def process_id() -> ProcessId:
    """This process: host, pid and, when Ray is already imported and connected here, its
    node, job, worker and actor ids (read from the local runtime context, no call to Ray)."""
    state = _mine()
    known = state.process
    if known is not None and known.node_id:
        return known
    ids = ("", "", "", "")
    ray = sys.modules.get("ray")
    try:
        if ray is not None and ray.is_initialized():
            ctx = ray.get_runtime_context()
            ids = (ctx.get_node_id() or "", ctx.get_job_id() or "", ctx.get_worker_id() or "",
                   ctx.get_actor_id() or "")
    except Exception:  # a client connection or a Ray shutting down: host and pid still say it
        pass
    state.process = ProcessId(socket.gethostname(), os.getpid(), *ids)
    return state.process
