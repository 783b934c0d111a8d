"""The worker alone: N probe cases x 10 zero-latency cycles queued to an idle worker,
with no consumer, until every event is in the event-log queue. Prints the worker's
and the broker's CPU per event, the figure to compare when changing the worker's hot
path (the end-to-end run mixes in every other process).

Usage: python -m bench.worker_alone [cases]
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

import aio_pika

from bench.harness import Processes, bench_settings, cpu_seconds, namespace, service_cpu
from bench.scenarios import submit_direct
from casetrail.adapters.bus.topology import Topology

CYCLES = 10
EVENTS_PER_CASE = CYCLES + 2
"""Ten REACT_CYCLE events, CASE_STARTED and CASE_COMPLETED."""


async def _until(channel: Any, queue: str, count: str, target: int) -> None:
    """Poll ``queue``'s declare-ok until its ``count`` field reaches ``target``."""
    while True:
        if getattr(await channel.queue_declare(queue, passive=True), count) >= target:
            return
        await asyncio.sleep(0.05)


async def worker_alone(cases: int = 1000) -> dict[str, Any]:
    settings = bench_settings(worker_concurrency=cases)
    events = cases * EVENTS_PER_CASE
    async with namespace(settings) as pool:
        stack = Processes(settings)
        worker = stack.spawn("worker", "worker")
        connection = await aio_pika.connect_robust(settings.amqp_url)
        try:
            channel = await (await connection.channel()).get_underlay_channel()
            topology = Topology(settings.namespace)
            await _until(channel, topology.case_start_queue, "consumer_count", 1)
            await asyncio.sleep(1)  # past start-up
            before, broker_before = cpu_seconds(worker.pid), service_cpu()["rabbitmq"]
            started = time.perf_counter()
            await submit_direct(settings, pool, cases, CYCLES, 0)
            await _until(channel, topology.event_log_queue, "message_count", events)
            seconds = time.perf_counter() - started
            worker_cpu = cpu_seconds(worker.pid) - before
            broker_cpu = service_cpu()["rabbitmq"] - broker_before
        finally:
            await connection.close()
            stack.stop()
    return {"cases": cases, "events": events, "seconds": round(seconds, 2),
            "workerCpuSeconds": round(worker_cpu, 2),
            "workerMicrosecondsPerEvent": round(worker_cpu / events * 1e6),
            "brokerMicrosecondsPerEvent": round(broker_cpu / events * 1e6)}


if __name__ == "__main__":
    print(asyncio.run(worker_alone(int(sys.argv[1]) if len(sys.argv) > 1 else 1000)))
