"""OpenTelemetry export of the step timelines: the same spans ``rlmon trace`` draws, over OTLP.

Off by default (config ``otlp.enabled``). Each finalized step with timelines becomes one trace:
a root span ``<role> step N`` from the first rank's start to the last rank's end, under it one
span per rank (``rank dp=.. cp=.. tp=.. pp=..``) over its step, and under that the rank's spans,
nested as they were recorded, with their attributes. Times are the ranks' own (unix ns); the
exporter is the SDK's OTLP/HTTP (protobuf) one behind a batch processor, so publishing never
waits on the collector.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlmon.service.config import OtlpConfig
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.contract.timeline import RankTimeline

__all__ = ["OtlpExport"]


class OtlpExport:
    """Sends finalized steps' timelines to an OTLP/HTTP endpoint (opentelemetry-sdk)."""

    def __init__(self, config: OtlpConfig) -> None:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError as exc:
            raise RuntimeError("otlp.enabled needs the otlp extra: pip install 'rlmon[otlp]' "
                               f"({exc})") from None
        self.provider = TracerProvider(
            resource=Resource.create({"service.name": config.service_name}))
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(
            endpoint=config.endpoint, timeout=int(config.timeout_seconds))))
        self.tracer = self.provider.get_tracer("rlmon")
        self.exported = 0  # steps handed to the exporter

    def export(self, records: Sequence[StepRecord]) -> None:
        for record in records:
            if record.timelines:
                self._step(record)
                self.exported += 1

    def _step(self, record: StepRecord) -> None:
        from opentelemetry import trace

        start = min(t.timeline.start_ns for t in record.timelines)
        end = max(t.timeline.end_ns for t in record.timelines)
        root = self.tracer.start_span(
            f"{record.role} step {record.step}", start_time=start, attributes={
                "rlmon.run": record.run, "rlmon.role": record.role, "rlmon.step": record.step,
                "rlmon.attempt": record.attempt, "rlmon.spans_cut": record.timelines_cut})
        context = trace.set_span_in_context(root)
        for ranked in record.timelines:
            self._rank(ranked, context)
        root.end(end_time=end)

    def _rank(self, ranked: RankTimeline, context: Any) -> None:
        from opentelemetry import trace

        tl = ranked.timeline
        attrs: dict[str, Any] = {f"rlmon.rank.{k}": v for k, v in ranked.rank.as_dict().items()}
        attrs.update({"host.name": tl.host, "process.pid": tl.pid, "rlmon.spans_cut": tl.cut})
        name = "rank " + " ".join(f"{k}={v}" for k, v in ranked.rank.as_dict().items())
        rank_span = self.tracer.start_span(name, context=context, start_time=tl.start_ns,
                                           attributes=attrs)
        stack = [(tl.end_ns, rank_span)]  # open spans, innermost last
        for span in sorted(tl.spans, key=lambda s: (s.start_ns, -s.end_ns, s.depth)):
            while len(stack) > 1 and span.start_ns >= stack[-1][0]:
                stack.pop()
            parent = trace.set_span_in_context(stack[-1][1])
            child = self.tracer.start_span(span.name, context=parent, start_time=span.start_ns,
                                           attributes=dict(span.attrs))
            child.end(end_time=span.end_ns)
            stack.append((span.end_ns, child))
        rank_span.end(end_time=tl.end_ns)

    def flush(self, timeout_s: float = 10.0) -> bool:
        return bool(self.provider.force_flush(int(timeout_s * 1000)))

    def close(self) -> None:
        self.provider.shutdown()
