"""The one sink protocol: an output of the service hears each verdict (vLLM's stat loggers'
shape: ``record`` per batch, the service holding a list of them).

A sink hears a verdict either before the commit stores it or after (:attr:`StepSink.before_commit`):
before, what the service itself shows (the exporter's /metrics, the sanity layer's findings),
so they never wait on the history write nor depend on it succeeding, as before the spine; after,
what leaves the process for another system (OTLP spans, the forward sink's trackers) or is
accounted from what was kept (goodput), so a batch whose write failed (the aggregator delivers it
again) is not sent twice. A sink of one's own hears the stored verdict.

The built-in sinks are the Prometheus exporter, the goodput ledger's accounting, the sanity
layer, the OTLP span export and the forward sink to W&B / MLflow / TensorBoard
(:mod:`rlmon.service.spine.sinks`, :mod:`rlmon.service.forward.sink`). A sink keeps what it
needs of a run or stream in memory only until :meth:`StepSink.forget` says it left.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import ClassVar, TypeVar

from rlmon.service.aggregation.stream_tracker import Expired
from rlmon.service.contract.run_info import RunInfo
from rlmon.service.spine.verdict import Verdict

__all__ = ["Sinks", "StepSink"]

S = TypeVar("S", bound="StepSink")


class StepSink:
    """An output of the service: a subclass overrides :meth:`record` and what else it needs (the
    rest do nothing)."""

    #: hear a verdict before the commit stores it (what the service shows), not after
    before_commit: ClassVar[bool] = False

    def start(self) -> None:
        """Start the sink's threads, if it has any (the service's ``start``; never its
        constructor)."""

    def record(self, verdict: Verdict) -> None:
        """A batch was judged, and stored unless :attr:`before_commit` (called under the
        service's lock: queue, never wait)."""
        raise NotImplementedError(f"{type(self).__name__} does not record verdicts")

    def run_info(self, run: str, info: RunInfo) -> None:
        """What the run's integration said of it (its settings, its framework)."""

    def finish_run(self, run: str) -> None:
        """The run said it finished."""

    def forget(self, expired: Expired) -> None:
        """These streams and runs left the service's memory: drop what is kept of them."""

    def close(self, timeout: float) -> None:
        """Send what is queued (up to ``timeout`` seconds) and stop."""


class Sinks:
    """The service's sinks; each phase's hear a verdict in the order given."""

    def __init__(self, sinks: Sequence[StepSink]) -> None:
        self._sinks = list(sinks)

    def __iter__(self) -> Iterator[StepSink]:
        return iter(self._sinks)

    def __getitem__(self, kind: type[S]) -> S:
        """The sink of class ``kind`` (``sinks[ExporterSink]``)."""
        found = next((s for s in self._sinks if isinstance(s, kind)), None)
        if found is None:
            raise KeyError(f"no {kind.__name__} among the service's sinks")
        return found

    def start(self) -> None:
        for sink in self._sinks:
            sink.start()

    def show(self, verdict: Verdict) -> None:
        """The sinks that hear a verdict before it is stored."""
        for sink in self._sinks:
            if sink.before_commit:
                sink.record(verdict)

    def record(self, verdict: Verdict) -> None:
        """The sinks that hear a verdict once it is stored."""
        for sink in self._sinks:
            if not sink.before_commit:
                sink.record(verdict)

    def run_info(self, run: str, info: RunInfo) -> None:
        for sink in self._sinks:
            sink.run_info(run, info)

    def finish_run(self, run: str) -> None:
        for sink in self._sinks:
            sink.finish_run(run)

    def forget(self, expired: Expired) -> None:
        for sink in self._sinks:
            sink.forget(expired)

    def close(self, timeout: float) -> None:
        for sink in self._sinks:
            sink.close(timeout)
