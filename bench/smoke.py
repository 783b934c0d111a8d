"""A small run of the benchmarks' pipelines, for CI: every component under its own
least-privileged identity (the bench namespaces are made by ``casetrail setup``),
end to end, the consumer alone, the per-event costs, and cases through the real
providers against a slow local model. It prints figures and
checks nothing about speed (``make bench`` measures); it fails only when a pipeline
does (a case that never completes, an event that is never stored).
``python -m bench.smoke``."""

from __future__ import annotations

import asyncio

from bench.e2e import end_to_end
from bench.harness import bench_settings
from bench.integrity import integrity_costs
from bench.ledger import append as ledger_append
from bench.models import run_cases
from bench.operations import traced_end_to_end
from bench.replay import replay_at_scale
from bench.scenarios import consumer_ingest
from bench.viewer import search_at_scale, streams_beside_posts


async def smoke() -> None:
    figures = await end_to_end(200, 10, settings=bench_settings(api_port=8791))
    print(f"end to end: {figures['cycles']} cycles, {figures['cyclesPerSecond']:,.0f}/s",
          flush=True)
    traced = await traced_end_to_end(200, 10, 0.1)
    print(f"end to end, traces at 10 %: {traced['cyclesPerSecond']:,.0f} cycles/s, "
          f"{traced['tracesReceived']} traces, {traced['spansReceived']} spans", flush=True)
    if traced["spansReceived"] == 0:
        raise SystemExit("no span reached the OTLP receiver")
    logged = await ledger_append(20_000)
    print(f"transparency log: {logged['leaves']} leaves, {logged['leavesPerSecond']:,}/s",
          flush=True)
    ingest = await consumer_ingest(bench_settings(), 10_000)
    print(f"consumer alone: {ingest['events']} events, {ingest['eventsPerSecond']:,.0f}/s",
          flush=True)
    print(f"per event: {integrity_costs(1000)}", flush=True)
    search = await search_at_scale(bench_settings(api_port=8795), 20_000, requests=20)
    print(f"search at {search['cases']:,} cases: slowest p99 {search['worstP99Ms']:.1f} ms "
          f"({search['worstShape']})", flush=True)
    streams = await streams_beside_posts(bench_settings(api_port=8796), 50, seconds=5)
    print(f"POST /cases p99 {streams['withStreams']['p99Ms']:.0f} ms beside "
          f"{streams['streams']} streams ({streams['eventsStreamedPerSecond']} events/s "
          "streamed)", flush=True)
    if streams["eventsStreamedPerSecond"] == 0:
        raise SystemExit("no event reached the streams")
    replayed = await replay_at_scale(600)
    print(f"replay: {replayed['replayed']} recorded cases in {replayed['seconds']} s, "
          f"{replayed['same']} same", flush=True)
    for provider in ("openai", "anthropic"):
        run = await run_cases(provider, 64, 32)
        print(f"{provider} provider: {run['answered']} of {run['cases']} cases answered, "
              f"{run['shareOfIdeal']:.0%} of the ideal turns/s, "
              f"{run['connectionsOpened']} connections", flush=True)
        if run["answered"] != run["cases"]:
            raise SystemExit(f"{provider}: only {run['answered']} cases answered")


if __name__ == "__main__":
    asyncio.run(smoke())
