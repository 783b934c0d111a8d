"""Durable once, not twice: where a durable event's cost goes, by experiment.

Three experiments, each against the path as it is, all processes on this machine:

``broker``
    The bus's share of an event: persistent, confirmed publishes of real event bytes
    into a quorum queue (today's ``<ns>.event-log``) and into a stream, consumed as they
    arrive with batched acks (the consumer's prefetch and batch), on the single node and
    on the three-node cluster (faults/cluster.py). Reported: events/s, the broker's
    CPU-µs an event (every Erlang VM on the machine) and the client's (publisher and
    reader in one process: the publisher is the same for both, so their difference is
    what reading the one or the other costs the consumer).
``postgres`` (bench/durable_postgres.py)
    Postgres's share of an event: the consumer's own statement (insert and fold, one
    transaction a batch) writing real-shaped events into the partitioned log, and the
    same with one change each: one unique key fewer (the month's ``(case_id,
    event_id)``), no transparency-log queue row per event (the upper bound of appending
    leaves per batch), the batch COPYed into a staging table first, batches of 20, and
    the log already holding a million events in the same month. Reported: events/s,
    every Postgres process's CPU-µs an event, bytes an event on disk.
``attribution``
    Postgres's CPU in the end-to-end case path, by the component whose connection
    spent it.
``worker``
    The worker's share of a model turn: ``bench.models`` (the real ``openai`` provider
    against the 300 ms model at concurrency 256) with uvloop and with asyncio's own loop,
    and with two worker processes of 128 each.

Usage: ``python -m bench.durable [broker|postgres|attribution|worker ...] [COUNT]``.
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from typing import Any

import aiormq

from bench.durable_postgres import BATCH, postgres, postgres_in_the_case_path
from bench.harness import median_run, service_cpu
from bench.raw import acking_in_batches, publish_all, sample_cycles
from casetrail.config import Settings

PREFETCH: int = Settings.model_fields["consumer_prefetch"].default
"""The consumer's default (``CASETRAIL_CONSUMER_PREFETCH``)."""

async def broker_share(url: str, kind: str, count: int, in_flight: int) -> dict[str, Any]:
    """``count`` events published (confirmed, persistent, ``in_flight`` unconfirmed at
    most) into a fresh queue of ``kind`` (``quorum`` or ``stream``) while a consumer
    takes them as the event-log consumer does (prefetch 2,000, one multiple ack a batch
    of 500, or what has arrived when nothing more is coming)."""
    bodies = [e.to_json() for e in sample_cycles(count)]
    queue = f"casetrail-bench-durable-{kind}-{uuid.uuid4().hex[:6]}"
    first = url.split(",", maxsplit=1)[0]
    connection = await aiormq.connect(first)
    consuming_connection = await aiormq.connect(first)
    try:
        channel = await connection.channel(publisher_confirms=True)
        await channel.queue_declare(queue, durable=True, arguments={"x-queue-type": kind})
        reader = await consuming_connection.channel()
        await reader.basic_qos(prefetch_count=PREFETCH)
        on_message, done = acking_in_batches(reader, count, min(BATCH, in_flight))
        # A stream is read from an offset (here its first message); a queue hands out
        # what it holds.
        arguments: dict[str, Any] = {"x-stream-offset": "first"} if kind == "stream" else {}
        await reader.basic_consume(queue, on_message, arguments=arguments)
        before, client = service_cpu()["rabbitmq"], time.process_time()
        started = time.perf_counter()
        await publish_all(channel, queue, bodies, in_flight)
        await asyncio.wait_for(done.wait(), 600)
        elapsed = time.perf_counter() - started
        broker = service_cpu()["rabbitmq"] - before
        client = time.process_time() - client
        await channel.queue_delete(queue)
    finally:
        await consuming_connection.close()
        await connection.close()
    return {"queue": kind, "inFlight": in_flight, "events": count,
            "bodyBytes": len(bodies[0]),
            "eventsPerSecond": round(count / elapsed),
            "brokerCpuMicroseconds": round(broker / count * 1e6, 1),
            "clientCpuMicroseconds": round(client / count * 1e6, 1)}


async def broker(count: int, rounds: int = 3) -> list[dict[str, Any]]:
    from faults import cluster

    async def shapes(bus: str, url: str) -> list[dict[str, Any]]:
        rows = []
        for in_flight in (1000, 64):
            for kind in ("quorum", "stream"):
                runs = [await broker_share(url, kind, count, in_flight)
                        for _ in range(rounds)]
                rows.append({"bus": bus, **median_run(runs, "brokerCpuMicroseconds")})
                print(rows[-1], [r["brokerCpuMicroseconds"] for r in runs], flush=True)
        return rows

    rows = await shapes("single node", "amqp://guest:guest@127.0.0.1:5672/")
    await asyncio.to_thread(cluster.start)
    try:
        rows += await shapes("3-node cluster", cluster.urls())
    finally:
        await asyncio.to_thread(cluster.stop)
    return rows


async def worker(cases: int = 1000, rounds: int = 3) -> list[dict[str, Any]]:
    from bench import models

    rows = []
    for label, loop, workers in (("uvloop, one worker", "uvloop", 1),
                                 ("asyncio, one worker", "asyncio", 1),
                                 ("uvloop, two workers of 128", "uvloop", 2)):
        runs = [await models.run_cases("openai", cases, 256, event_loop=loop,
                                       workers=workers) for _ in range(rounds)]
        rows.append({"shape": label, **median_run(runs, "shareOfIdeal")})
    return rows


async def measure(scale: float, rounds: int) -> dict[str, Any]:
    """Every experiment, for ``make bench``."""
    return {
        "broker": await broker(int(20_000 * scale), rounds),
        "postgres": await postgres(int(100_000 * scale), rounds,
                                   prefill=int(1_000_000 * scale)),
        "postgresByRole": await postgres_in_the_case_path(int(1000 * scale)),
        "worker": await worker(int(1000 * scale), rounds),
    }


def rows(r: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """``make bench``'s rows of the experiments."""
    x = r.get("durable")
    if not x:
        return []
    out = [(f"bus share, {b['queue']}, {b['bus']}, {b['inFlight']:,} in flight",
            f"{b['brokerCpuMicroseconds']:,.0f} µs", "",
            f"broker CPU an event, published confirmed and consumed; client (publisher and "
            f"reader) {b.get('clientCpuMicroseconds', 0):,.0f} µs; {b['eventsPerSecond']:,}"
            f" events/s; {b['bodyBytes']} B bodies") for b in x["broker"]]
    out += [(f"Postgres share, {p['variant']}", f"{p['postgresCpuMicroseconds']:,.0f} µs", "",
             f"Postgres CPU an event of the consumer's statement; {p['eventsPerSecond']:,} "
             f"events/s; {p['bytesPerEvent']:,} B an event on disk") for p in x["postgres"]]
    roles = x["postgresByRole"]["postgresCpuMicrosecondsByRole"]
    out.append(("Postgres share in the case path, by component",
                f"{sum(roles.values()):,.0f} µs", "", "a cycle, end to end: " + ", ".join(
                    f"{who} {v:,.0f}" for who, v in roles.items())))
    out += [(f"worker share at 256, {w['shape']}", f"{w['shareOfIdeal']:.0%}", "",
             f"openai provider, 300 ms model; {w['turnsPerSecond']:,.0f} turns/s; worker "
             f"{w['workerCpuSeconds'] / max(w['turns'], 1) * 1e6:,.0f} CPU-µs a turn")
            for w in x["worker"]]
    return out


async def main(args: list[str]) -> None:
    numbers = [int(a) for a in args if a.isdigit()]
    parts = [a for a in args if not a.isdigit()] or ["broker", "postgres", "worker"]
    if "broker" in parts:
        await broker(numbers[0] if numbers else 30_000)
    if "attribution" in parts:
        print(await postgres_in_the_case_path(numbers[0] if numbers else 1000), flush=True)
    if "postgres" in parts:
        for row in await postgres(numbers[0] if numbers else 100_000):
            print(row, flush=True)
    if "worker" in parts:
        for row in await worker(numbers[0] if numbers else 1000):
            print(row, flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
