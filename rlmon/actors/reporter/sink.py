"""Where a Reporter's step messages go: the sink protocol and the sinks without Ray; and the
Reporters still open in this process.

A sink takes a batch of :class:`~rlmon.service.contract.step_message.StepMessage` s and returns
once they are accepted (or raises to be retried later). :class:`LocalSink` runs the aggregator's
step assembler in-process; :class:`JsonlSink` appends contract lines to a file. The Ray sink,
:class:`rlmon.actors.runtime.RaySink`, lives with the runtime it starts and finds. The registry of
open senders lets the runtime's exit hook flush every Reporter without importing the Reporter;
:func:`default_sink` gives a Reporter created without a sink the Ray sink, which
:mod:`rlmon.actors` registers (so the client never imports the Ray shell that imports it).
"""

from __future__ import annotations

import json
import math
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from rlmon.service.aggregation.assembly import StepAssembler
from rlmon.service.contract.acks import IngestAck
from rlmon.service.contract.records import ContractError
from rlmon.service.contract.step_message import StepMessage
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.metrics.forms import FORMS
from rlmon.service.metrics.nonfinite import nonfinite_name
from rlmon.service.metrics.partial import ALL_AXES, Partial

__all__ = ["JsonlSink", "LocalSink", "ReportSink", "SinkClosed", "close_open_senders",
           "default_sink", "open_senders", "set_default_sink", "track_sender"]


class ReportSink(Protocol):
    """Where step messages go. ``send`` returns once they are accepted, or raises to retry later.

    It may return an :class:`~rlmon.service.contract.acks.IngestAck` (``incarnation`` and
    ``floors``); the Reporter then keeps the messages of steps not yet finalized and resends them
    to a restarted aggregator.
    """

    def send(self, messages: Sequence[StepMessage]) -> IngestAck | None: ...


DefaultSink = Callable[..., ReportSink]  # (namespace, *, start_service, options) -> sink
_default: list[DefaultSink] = []


def set_default_sink(make: DefaultSink) -> None:
    """Register what :func:`default_sink` builds (:mod:`rlmon.actors`: the Ray sink)."""
    _default[:] = [make]


def default_sink(namespace: str, *, start_service: bool, options: Any) -> ReportSink:
    """The sink of a Reporter created without one: the namespace's aggregator on Ray."""
    if not _default:
        raise RuntimeError("rlmon: no default sink is registered (rlmon.actors registers the Ray "
                           "sink when it is imported); pass sink= to the Reporter")
    return _default[0](namespace, start_service=start_service, options=options)


class SinkClosed(RuntimeError):
    """Raised by a sink that can never deliver again (Ray shut down for good): the Reporter
    counts what it holds as dropped, says so once, and stops sending."""


class LocalSink:
    """An in-process sink feeding a step assembler: the Reporter without Ray (tests, notebooks).

    Finalized steps collect in ``records``; ``on_record`` sees each as it finalizes.
    """

    def __init__(
        self,
        assembler: StepAssembler | None = None,
        on_record: Callable[[StepRecord], None] | None = None,
    ) -> None:
        self.assembler = assembler if assembler is not None else StepAssembler()
        self.records: list[StepRecord] = []
        self.on_record = on_record
        self._lock = threading.Lock()

    def send(self, messages: Sequence[StepMessage]) -> IngestAck:
        """Add the messages; one that breaks the contract is refused and counted in the ack, as
        the aggregator does (raising would make the Reporter retry it forever)."""
        ack = IngestAck()
        with self._lock:
            for msg in messages:
                try:
                    outcome, record = self.assembler.add_message(msg)
                except ContractError as exc:
                    ack.refuse(msg, exc, max_errors=20)
                    continue
                ack.tally(outcome)
                if record is not None:
                    self.records.append(record)
                    if self.on_record is not None:
                        self.on_record(record)
        return ack

    def finalize_all(self) -> list[StepRecord]:
        with self._lock:
            done = self.assembler.finalize_all()
            self.records.extend(done)
            return list(done)


class JsonlSink:
    """A Reporter sink appending contract lines (docs/contract.md, JSON Lines v1) to a file.

    For processes that cannot reach the aggregator (a vLLM engine under test, an offline run):
    ``rlmon replay FILE`` reads the result. The integrations select it with
    ``RLMON_SINK_JSONL=path``.
    """

    def __init__(self, path: str) -> None:
        self.path = path

    def send(self, messages: Sequence[StepMessage]) -> None:
        lines = []
        for msg in messages:
            for rep in msg.reports():
                line: dict[str, Any] = {
                    "run": rep.run, "role": rep.role, "step": rep.step,
                    "rank": rep.rank.as_dict(), "world": rep.world.as_dict(),
                    "final": rep.final, "minibatch": rep.minibatch,
                    "metrics": {n: _partial_json(p) for n, p in rep.metrics.items()},
                }
                if rep.seq is not None:
                    line["seq"] = rep.seq
                lines.append(json.dumps(line) + "\n")
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.writelines(lines)


def _partial_json(partial: Partial) -> dict[str, Any]:
    """A partial as the contract's metric object (non-finite numbers as the contract spells
    them)."""

    def num(x: float) -> Any:
        if math.isfinite(x):
            return x
        return nonfinite_name(x)

    spec = FORMS[partial.form]
    if spec.ranked is not None:  # {"k": .., "top": [[score, id, payload], ...]}, JSON-ready
        return spec.as_keys(partial.state)
    out: dict[str, Any] = {key: num(v) for key, v in spec.as_keys(partial.state).items()}
    if partial.replicated is not None and not (
            spec.replicated_by_default and partial.replicated == ALL_AXES):
        out["replicated"] = sorted(partial.replicated)
    if partial.minibatch_mean:
        out["minibatch_reduce"] = "mean"
    return out


class _Sender(Protocol):
    def close(self, timeout: float = ...) -> None: ...


# Every sender (Reporter) not yet closed, so that interpreter exit flushes them while Ray is up.
_OPEN: weakref.WeakSet[_Sender] = weakref.WeakSet()
_OPEN_LOCK = threading.Lock()


def track_sender(sender: _Sender, open_: bool = True) -> None:
    """Note a sender as open (or, with ``open_`` false, as closed)."""
    with _OPEN_LOCK:
        if open_:
            _OPEN.add(sender)
        else:
            _OPEN.discard(sender)


def open_senders() -> list[_Sender]:
    """The senders (Reporters) of this process not yet closed."""
    with _OPEN_LOCK:
        return list(_OPEN)


def close_open_senders(timeout: float = 10.0) -> None:
    """Flush and close every open sender of this process (the runtime's exit hook calls it);
    ``timeout`` bounds the whole wait, not each sender's."""
    deadline = time.monotonic() + timeout
    with _OPEN_LOCK:
        senders = list(_OPEN)
    for sender in senders:
        sender.close(max(0.0, deadline - time.monotonic()))
