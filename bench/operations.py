"""What operating casetrail costs: end to end with traces exported at a sampling ratio
(metrics are always on), against an OTLP/HTTP sink in this process."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from bench.e2e import end_to_end
from bench.harness import bench_settings
from bench.models import free_port


async def traced_end_to_end(cases: int, cycles: int, ratio: float) -> dict[str, Any]:
    """The end-to-end run with every component exporting spans (``parentbased_traceidratio``
    at ``ratio``, the root being POST /cases) to a sink that counts them."""
    received = {"requests": 0, "spans": 0, "traces": set()}

    async def traces(request: web.Request) -> web.Response:
        body = ExportTraceServiceRequest.FromString(await request.read())
        received["requests"] += 1  # type: ignore[operator]
        for resource in body.resource_spans:
            for scope in resource.scope_spans:
                received["spans"] += len(scope.spans)  # type: ignore[operator]
                received["traces"].update(s.trace_id for s in scope.spans)  # type: ignore[attr-defined]
        return web.Response(body=ExportTraceServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")

    port = free_port()
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/traces", traces)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        run = await end_to_end(cases, cycles, settings=bench_settings(api_port=8790), env={
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
            "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": str(ratio)})
        # (each component flushed its spans as it stopped, inside end_to_end)
    finally:
        await runner.cleanup()
    return run | {"sampling": ratio, "spansReceived": received["spans"],
                  "tracesReceived": len(received["traces"])}  # type: ignore[arg-type]


if __name__ == "__main__":
    import sys

    n, k = (int(a) for a in (sys.argv[1:3] + ["1000", "10"][len(sys.argv[1:3]):]))
    ratio = float(sys.argv[3]) if len(sys.argv) > 3 else 0.1
    print(asyncio.run(traced_end_to_end(n, k, ratio)))
