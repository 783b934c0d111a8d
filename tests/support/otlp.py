"""A small OTLP/HTTP receiver for the tests: takes ``POST /v1/traces`` (protobuf), as a
collector would, and keeps the spans it was sent, decoded with opentelemetry-proto."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from tests.support.stack import free_port

KINDS = {1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}


def _value(value: AnyValue) -> Any:
    match value.WhichOneof("value"):
        case "array_value":
            return [_value(v) for v in value.array_value.values]
        case None:
            return None
        case kind:
            return getattr(value, kind)


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_id: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    status_code: int
    """0 unset, 1 ok, 2 error."""


@dataclass
class Receiver:
    url: str
    spans: list[ReceivedSpan] = field(default_factory=list)
    requests: int = 0

    def take(self, body: bytes) -> None:
        request = ExportTraceServiceRequest.FromString(body)
        self.requests += 1
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    self.spans.append(ReceivedSpan(
                        service=resource.get("service.name", ""), name=span.name,
                        kind=KINDS.get(span.kind, str(span.kind)),
                        trace_id=span.trace_id.hex(), span_id=span.span_id.hex(),
                        parent_id=span.parent_span_id.hex(),
                        start_ns=span.start_time_unix_nano, end_ns=span.end_time_unix_nano,
                        attributes={a.key: _value(a.value) for a in span.attributes},
                        status_code=span.status.code))

    def of_trace(self, trace_id: str) -> list[ReceivedSpan]:
        return [s for s in self.spans if s.trace_id == trace_id]


@asynccontextmanager
async def otlp_receiver() -> AsyncIterator[Receiver]:
    """An OTLP/HTTP endpoint on a free port (``receiver.url`` is its base URL)."""
    port = free_port()
    receiver = Receiver(f"http://127.0.0.1:{port}")

    async def traces(request: web.Request) -> web.Response:
        if request.content_type != "application/x-protobuf":
            return web.Response(status=415)
        receiver.take(await request.read())
        return web.Response(body=ExportTraceServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", traces)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        yield receiver
    finally:
        await runner.cleanup()
