"""A small run of the benchmarks' pipelines, for CI: every component under its own
least-privileged identity (the bench namespaces are made by ``casetrail setup``),
end to end, the consumer alone, and the per-event costs. It prints figures and
checks nothing about speed (``make bench`` measures); it fails only when a pipeline
does (a case that never completes, an event that is never stored).
``python -m bench.smoke``."""

from __future__ import annotations

import asyncio

from bench.e2e import end_to_end
from bench.harness import bench_settings
from bench.integrity import integrity_costs
from bench.scenarios import consumer_ingest


async def smoke() -> None:
    figures = await end_to_end(200, 10, settings=bench_settings(api_port=8791))
    print(f"end to end: {figures['cycles']} cycles, {figures['cyclesPerSecond']:,.0f}/s",
          flush=True)
    ingest = await consumer_ingest(bench_settings(), 10_000)
    print(f"consumer alone: {ingest['events']} events, {ingest['eventsPerSecond']:,.0f}/s",
          flush=True)
    print(f"per event: {integrity_costs(1000)}", flush=True)


if __name__ == "__main__":
    asyncio.run(smoke())
