"""OTLP export of the step timelines: off by default; on, a loopback OTLP/HTTP receiver gets
the spans and decodes them with OpenTelemetry's own protobuf classes."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.support.polling import wait_for

pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)

from rlmon.service.config import Settings
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.contract.timeline import RankTimeline, Span, Timeline
from rlmon.service.metrics.rank import Rank
from rlmon.service.service_core import ServiceCore
from rlmon.service.spine.sinks import OtlpSink
from tests.support.records import step_record

S = 1_000_000_000


class OtlpReceiver:
    """A loopback OTLP/HTTP traces endpoint: decodes each request's protobuf body."""

    def __init__(self) -> None:
        self.requests: list[ExportTraceServiceRequest] = []
        self.content_types: list[str] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.content_types.append(self.headers["Content-Type"])
                receiver.requests.append(ExportTraceServiceRequest.FromString(body))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"

    def spans(self) -> list[Any]:
        return [span for request in self.requests for rs in request.resource_spans
                for ss in rs.scope_spans for span in ss.spans]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver()
    yield r
    r.close()


def _record() -> StepRecord:
    def rank(d: int) -> RankTimeline:
        spans = (Span("generate", 11 * S, (13 + d) * S, 1, (("engine", "vllm"),)),
                 Span("rollout", 10 * S, (14 + d) * S, 0, (("batch", 8),)),
                 Span("train", (14 + d) * S, 19 * S, 0))
        return RankTimeline(Rank(dp=d), Timeline(10 * S, 20 * S, spans, host="node-a", pid=9))
    return step_record(run="grpo", step=7, ranks_expected=2, timelines=(rank(0), rank(1)))


def test_otlp_is_off_by_default() -> None:
    assert Settings().otlp.enabled is False
    service = ServiceCore(Settings.model_validate({"notifiers": {"console": {"enabled": False}}})).start()
    assert service.spine.sinks[OtlpSink].otlp is None
    service.close()


def test_spans_reach_a_loopback_otlp_receiver(receiver: OtlpReceiver, tmp_path: Path) -> None:
    settings = Settings.model_validate({
        "notifiers": {"console": {"enabled": False}},
        "outbox": {"path": str(tmp_path / "outbox.sqlite")},
        "otlp": {"enabled": True, "endpoint": receiver.url, "service_name": "rlmon-test"}})
    service = ServiceCore(settings).start()
    try:
        service.publish([_record()])
        assert (otlp := service.spine.sinks[OtlpSink].otlp) is not None and otlp.flush(10)
        spans = wait_for(lambda: len(receiver.spans()) == 9 and receiver.spans(), 10,
                         "9 spans at the receiver")
    finally:
        service.close()
    assert receiver.content_types[0] == "application/x-protobuf"
    resource = receiver.requests[0].resource_spans[0].resource
    assert {a.key: a.value.string_value for a in resource.attributes}["service.name"] == \
        "rlmon-test"
    by_id = {s.span_id: s for s in spans}
    (root,) = [s for s in spans if not s.parent_span_id]
    assert root.name == "actor step 7"
    assert (root.start_time_unix_nano, root.end_time_unix_nano) == (10 * S, 20 * S)
    assert len({s.trace_id for s in spans}) == 1  # one trace per step

    def path(span: Any) -> str:
        names = [span.name]
        while span.parent_span_id:
            span = by_id[span.parent_span_id]
            names.append(span.name)
        return "/".join(reversed(names))

    got = sorted((path(s), s.start_time_unix_nano, s.end_time_unix_nano) for s in spans)
    rank0, rank1 = "actor step 7/rank dp=0 cp=0 tp=0 pp=0", "actor step 7/rank dp=1 cp=0 tp=0 pp=0"
    assert got == sorted([
        ("actor step 7", 10 * S, 20 * S),
        (rank0, 10 * S, 20 * S), (rank1, 10 * S, 20 * S),
        (f"{rank0}/rollout", 10 * S, 14 * S), (f"{rank1}/rollout", 10 * S, 15 * S),
        (f"{rank0}/rollout/generate", 11 * S, 13 * S),
        (f"{rank1}/rollout/generate", 11 * S, 14 * S),
        (f"{rank0}/train", 14 * S, 19 * S), (f"{rank1}/train", 15 * S, 19 * S)])
    generate = next(s for s in spans if s.name == "generate")
    assert {a.key: a.value.string_value for a in generate.attributes} == {"engine": "vllm"}
    rank = next(s for s in spans if s.name.startswith("rank dp=1"))
    attrs = {a.key: a.value for a in rank.attributes}
    assert attrs["rlmon.rank.dp"].int_value == 1 and attrs["host.name"].string_value == "node-a"
