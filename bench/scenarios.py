"""The stack-level scenarios: latency at offered load, concurrency with a slow model,
consumer ingest alone, and POST /cases."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any

import aio_pika
import asyncpg
import orjson

from bench.e2e import ab_post
from bench.harness import (
    Processes,
    api_key,
    cpu_seconds,
    namespace,
    peak_rss_mb,
    percentiles,
    service_cpu,
    wait_ready,
    wait_rows,
)
from bench.raw import sample_cycles
from casetrail.adapters.bus.publisher import Publisher, event_emitter
from casetrail.adapters.bus.topology import Topology
from casetrail.config import Settings
from casetrail.contract.commands import CaseStartCommand
from casetrail.contract.events import Limits, ModelRef, make_event, new_case_id
from casetrail.trail.keyfile import action_signer, worker_signer
from casetrail.trail.person_actions import sign_object, start_object


async def latency_at(settings: Settings, rates: list[int], seconds: float = 8.0
                     ) -> list[dict[str, Any]]:
    """Publish REACT_CYCLE events at a fixed offered rate through the real consumer;
    latency = committed (``recorded_at``) - published (``occurredAt``)."""
    results = []
    async with namespace(settings) as pool:
        stack = Processes(settings)
        stack.spawn("consumer", "consumer")
        # Events as the worker publishes them: the consumer takes no one else's.
        connection = await aio_pika.connect_robust(settings.identity("worker").amqp_url)
        try:
            publisher = event_emitter(await Publisher.open(connection),
                                      Topology(settings.namespace), worker_signer(settings))
            await asyncio.sleep(2)  # the consumer is up
            for rate in rates:
                total = int(rate * seconds)
                template = sample_cycles(1)[0]
                case_id = new_case_id()
                interval = 1.0 / rate
                started = time.perf_counter()
                pending = set()
                for i in range(total):
                    due = started + i * interval
                    delay = due - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    event = make_event(case_id, 1, i, template.payload)
                    task = asyncio.create_task(publisher.emit(event))
                    pending.add(task)
                    task.add_done_callback(pending.discard)
                await asyncio.gather(*pending)
                achieved = total / (time.perf_counter() - started)
                await wait_rows(pool, "SELECT count(*) FROM event_log WHERE case_id = $1",
                                total, 120, case_id)
                rows = await pool.fetch(
                    "SELECT extract(epoch FROM recorded_at - occurred_at) * 1000 AS ms "
                    "FROM event_log WHERE case_id = $1", case_id)
                figures = percentiles([float(r["ms"]) for r in rows])
                results.append({"offeredPerSecond": rate, "achievedPerSecond": round(achieved),
                                "events": total,
                                **{f"{k}Ms": round(v, 1) for k, v in figures.items()}})
        finally:
            await connection.close()
            stack.stop()
    return results


async def submit_direct(settings: Settings, pool: asyncpg.Pool, cases: int, cycles: int,
                         latency_ms: int) -> None:
    """Queue cases the way the API does (row, then confirmed start command), without
    HTTP, so the worker alone is what is measured."""
    model = ModelRef(provider="scripted", name="probe-slow", latency_ms=latency_ms)
    limits = Limits(max_cycles=cycles + 1, deadline_seconds=300)
    ids = [new_case_id() for _ in range(cases)]
    # Signed as the API signs a start (a worker runs no case whose start is not).
    signer, now = action_signer(settings), datetime.now(UTC)
    await pool.executemany(
        "INSERT INTO cases (case_id, agent, input, model, limits, request_digest, "
        "start_action) VALUES ($1, 'throughput-probe', $2::jsonb, $3::jsonb, $4::jsonb, "
        "'bench', $5::jsonb)",
        [(i, orjson.dumps({"cycles": cycles}).decode(),
          model.model_dump_json(by_alias=True), limits.model_dump_json(by_alias=True),
          orjson.dumps(sign_object(signer, start_object(
              i, "default", "throughput-probe", None, {"cycles": cycles}, now)).as_json()
          ).decode())
         for i in ids])
    # Published as the API would (the worker takes start commands from it alone).
    connection = await aio_pika.connect_robust(settings.identity("api").amqp_url)
    publisher = await Publisher.open(connection)
    topology = Topology(settings.namespace)
    await asyncio.gather(*(
        publisher.publish(topology.commands_exchange, Topology.START_KEY,
                          CaseStartCommand(case_id=i, agent="throughput-probe").to_json())
        for i in ids))
    await connection.close()


async def concurrency_sweep(settings: Settings, levels: list[int], cycles: int = 10,
                            turn_ms: int = 500) -> list[dict[str, Any]]:
    """N concurrent cases on one worker process with a model that takes ``turn_ms`` a
    turn: throughput as a share of the ideal, and the worker's peak RSS. The span runs
    from the first ``CASE_STARTED`` to the last ``CASE_COMPLETED``, so it includes
    starting all N cases."""
    results = []
    for level in levels:
        run = settings.model_copy(update={
            "namespace": f"{settings.namespace}-c{level}",
            "database_url": f"{settings.database_url}_c{level}",
            "worker_concurrency": max(level, 1)})
        async with namespace(run) as pool:
            # Every case is queued before the worker starts, so what is measured is
            # the worker running them, not how fast this script can submit them.
            await submit_direct(run, pool, level, cycles, turn_ms)
            stack = Processes(run)
            worker = stack.spawn("worker", "worker")
            stack.spawn("consumer", "consumer")
            try:
                await wait_rows(pool, "SELECT count(*) FROM event_log WHERE event_type = "
                                "'CASE_COMPLETED'", level, 300)
                span = await pool.fetchrow(
                    "SELECT extract(epoch FROM max(occurred_at) FILTER (WHERE event_type = "
                    "'CASE_COMPLETED') - min(occurred_at)) AS seconds, count(*) FILTER "
                    "(WHERE event_type = 'REACT_CYCLE') AS cycles FROM event_log")
                rss = peak_rss_mb(worker.pid)
                assert span is not None
            finally:
                stack.stop()
        seconds = float(span["seconds"])
        ideal_seconds = cycles * turn_ms / 1000
        results.append({
            "concurrentCases": level, "cycles": span["cycles"], "seconds": round(seconds, 2),
            "cyclesPerSecond": round(span["cycles"] / seconds, 1),
            "idealCyclesPerSecond": round(level * cycles / ideal_seconds, 1),
            "shareOfIdeal": round(ideal_seconds / seconds, 3),
            "workerPeakRssMb": round(rss, 1),
        })
    return results


async def consumer_ingest(settings: Settings, count: int = 100_000, consumers: int = 1
                          ) -> dict[str, Any]:
    """``count`` REACT_CYCLE events queued first, then ``consumers`` consumer processes
    drain them. The rate is taken from the first commit to the last (each batch's rows
    share one ``recorded_at``), so process start-up is reported apart."""
    async with namespace(settings) as pool:
        connection = await aio_pika.connect_robust(settings.identity("worker").amqp_url)
        sink = event_emitter(await Publisher.open(connection), Topology(settings.namespace),
                             worker_signer(settings))
        events = sample_cycles(count)
        gate = asyncio.Semaphore(1000)

        async def one(event: Any) -> None:
            async with gate:
                await sink.emit(event)

        # In seq order, as a worker emits an attempt's events (each chained to the last).
        await asyncio.gather(*(one(e) for e in events))
        await connection.close()
        stack = Processes(settings)
        started = time.time()
        for i in range(consumers):
            stack.spawn(f"consumer-{i}", "consumer")
        try:
            await wait_rows(pool, "SELECT count(*) FROM event_log", count, 600)
            span = await pool.fetchrow(
                "SELECT extract(epoch FROM min(recorded_at)) AS first, "
                "extract(epoch FROM max(recorded_at)) AS last, count(*) FILTER (WHERE "
                "recorded_at = (SELECT min(recorded_at) FROM event_log)) AS first_batch "
                "FROM event_log")
            assert span is not None
        finally:
            stack.stop()
    draining = float(span["last"]) - float(span["first"])
    return {"events": count, "consumers": consumers,
            "eventsPerSecond": round((count - span["first_batch"]) / draining),
            "drainSeconds": round(draining, 2),
            "startupSeconds": round(float(span["first"]) - started, 2),
            "eventsPerSecondWithStartup": round(count / (float(span["last"]) - started))}


async def api_posts(settings: Settings, requests: int = 3000, concurrency: int = 32
                    ) -> dict[str, Any]:
    """``POST /cases`` with one uvicorn worker (no case worker: commands queue up)."""
    async with namespace(settings) as pool:
        key = await api_key(pool)
        stack = Processes(settings)
        stack.spawn("api", "api", "--port", str(settings.api_port))
        try:
            await wait_ready(f"http://127.0.0.1:{settings.api_port}")
            api = stack.children["api"].pid
            before = {"api": cpu_seconds(api)} | service_cpu()
            # Every request's key is checked (a cached lookup and one SHA-256).
            figures = await asyncio.to_thread(
                ab_post, f"http://127.0.0.1:{settings.api_port}/cases",
                {"agent": "throughput-probe", "input": {"cycles": 3}}, requests, concurrency,
                key)
            after = {"api": cpu_seconds(api)} | service_cpu()
        finally:
            stack.stop()
    return {"requests": requests, "concurrency": concurrency, **figures,
            "cpuMicrosecondsPerPost": {name: round((after[name] - before[name]) / requests * 1e6)
                                       for name in after}}
