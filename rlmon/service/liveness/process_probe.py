"""Whether the processes of a silent run still exist: frozen is not dead.

A run whose every Reporter went silent is either gone (killed, crashed without a word, its node
lost) or frozen (stopped with SIGSTOP or Ctrl-Z, paused in a debugger, a call holding the GIL so
long that the sender thread cannot run). Silence alone cannot tell them apart; the process can.
Each heartbeat names its process (:class:`~rlmon.service.contract.heartbeat.ProcessId`) and the
liveness tracker asks a :class:`ProcessProbe` about the processes of a silent run before calling
it dead.

:class:`SameNodeProbe` answers for processes on the node the probe runs on (the aggregator's):
``/proc/<pid>/stat`` (a zombie is gone; state ``T`` is stopped; a process that started after the
rank was first heard is another process that reused the pid), else ``os.kill(pid, 0)``. For a
process on another node it answers ``unknown``. The Ray implementation
(:mod:`rlmon.actors.process_probe`) asks Ray's GCS about the job's driver and the actors first.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from rlmon.service.contract.heartbeat import ProcessId
from rlmon.service.liveness.ray_ending import RayFacts

__all__ = ["ProcessFate", "ProcessProbe", "SameNodeProbe", "Sighting", "judge_sightings"]


class ProcessFate(StrEnum):
    ALIVE = "alive"  # the process exists (it may be running, stopped or blocked)
    GONE = "gone"  # it does not exist any more
    UNKNOWN = "unknown"  # nothing the probe can see says either


@dataclass(frozen=True, slots=True)
class Sighting:
    """What a probe saw of one process, and how it knows (said in the alert's text)."""

    fate: ProcessFate
    how: str  # "same node: pid 4242 is stopped (SIGSTOP, Ctrl-Z or a debugger)", ...
    # what Ray knows of how the process ended (its actor's death cause, its last failed task,
    # its Ray Job's status): the tracker judges it (rlmon.service.liveness.ray_ending)
    facts: RayFacts | None = None


class ProcessProbe(Protocol):
    """Asked, for the processes of a silent run, whether they still exist. ``since`` is when the
    tracker first heard each process (a process started later is not the one that reported).

    A probe that knows Ray's actors may also offer ``failed_tasks(actor_ids)``: of those live
    actors, the ones whose last task failed (a :class:`~rlmon.service.liveness.ray_ending.
    TaskFailure` each), asked of an overdue run's idle ranks."""

    def check(self, processes: Sequence[ProcessId],
              since: Mapping[ProcessId, float]) -> dict[ProcessId, Sighting]: ...


_STOPPED = {"T": "stopped (SIGSTOP, Ctrl-Z)", "t": "stopped by a debugger (traced)"}
_DEAD_STATES = {"Z", "X", "x"}


def _boot_time() -> float | None:
    try:
        with open("/proc/stat", encoding="ascii") as f:
            for line in f:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except OSError:
        return None
    return None


class SameNodeProbe:
    """Processes on this node, by pid (never a process on another node: that is ``unknown``)."""

    def __init__(self, hostname: str | None = None) -> None:
        self.hostname = hostname or socket.gethostname()
        self._boot = _boot_time()
        try:
            self._ticks = float(os.sysconf("SC_CLK_TCK"))
        except (ValueError, OSError, AttributeError):
            self._ticks = 100.0

    def check(self, processes: Sequence[ProcessId],
              since: Mapping[ProcessId, float]) -> dict[ProcessId, Sighting]:
        return {p: self.sight(p, since.get(p)) for p in processes}

    def sight(self, process: ProcessId, since: float | None = None) -> Sighting:
        if process.hostname != self.hostname or process.pid <= 0:
            return Sighting(ProcessFate.UNKNOWN,
                            f"pid {process.pid} runs on {process.hostname or 'an unnamed host'}, "
                            f"not on this node ({self.hostname})")
        pid = process.pid
        stat = self._stat(pid)
        if stat is None:
            return self._kill_zero(pid)
        state, started = stat
        if not state:
            return Sighting(ProcessFate.GONE, f"same node: no process {pid}")
        if state in _DEAD_STATES:
            return Sighting(ProcessFate.GONE, f"same node: pid {pid} has exited (a zombie)")
        if started is not None and since is not None and started > since + 1.0:
            return Sighting(ProcessFate.GONE, f"same node: pid {pid} exited (the pid now belongs "
                                              "to a process started after the rank reported)")
        what = _STOPPED.get(state, "exists")
        return Sighting(ProcessFate.ALIVE, f"same node: pid {pid} {what}")

    def _stat(self, pid: int) -> tuple[str, float | None] | None:
        """(state letter, start time in unix seconds) from /proc, None where /proc says nothing."""
        try:
            with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
                text = f.read()
        except FileNotFoundError:
            return ("", None) if os.path.isdir("/proc/self") else None  # "": no such pid
        except OSError:
            return None
        # the command name may hold spaces and parentheses: fields follow the last ')'
        fields = text[text.rfind(")") + 2:].split()
        if not fields:
            return None
        started = None
        if self._boot is not None and len(fields) > 19:
            try:
                started = self._boot + int(fields[19]) / self._ticks
            except ValueError:
                started = None
        return fields[0], started

    @staticmethod
    def _kill_zero(pid: int) -> Sighting:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return Sighting(ProcessFate.GONE, f"same node: no process {pid}")
        except PermissionError:
            return Sighting(ProcessFate.ALIVE, f"same node: pid {pid} exists (another user's)")
        except OSError as exc:
            return Sighting(ProcessFate.UNKNOWN, f"same node: pid {pid}: {exc}")
        return Sighting(ProcessFate.ALIVE, f"same node: pid {pid} exists")


def judge_sightings(sightings: Sequence[Sighting]) -> ProcessFate:
    """A silent run's processes together: alive when any exists (it holds its GPUs and may come
    back), gone when every one is known gone, unknown otherwise (no process named, or some the
    probe cannot see and none seen alive)."""
    if any(s.fate is ProcessFate.ALIVE for s in sightings):
        return ProcessFate.ALIVE
    if sightings and all(s.fate is ProcessFate.GONE for s in sightings):
        return ProcessFate.GONE
    return ProcessFate.UNKNOWN
