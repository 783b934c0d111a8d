"""Wiring each long-running component to its connections, until a signal stops it."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import asyncpg
from aio_pika.abc import AbstractRobustConnection
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay, wait_fixed

from consumers.event_log import EventLogConsumer
from consumers.writer import EventLogWriter
from service.agents import CAPABILITIES
from service.bus.publisher import Publisher, connect
from service.bus.rpc import BusWorkerRuntime, RetryPolicy
from service.bus.topology import Topology
from service.capability_worker import CapabilityWorker
from service.config import Settings
from service.errors import BusUnavailable, StoreUnavailable
from service.providers import ModelFactory
from service.store import CaseStore, create_pool
from service.supervisor import run_until_signal
from service.worker import CaseWorker

log = logging.getLogger("casetrail")

STARTUP_PATIENCE_SECONDS = 60.0
"""How long a component waits for the broker and the database to answer at start."""


async def connect_patiently(settings: Settings, name: str) -> AbstractRobustConnection:
    """A robust broker connection, waiting up to a minute for the broker at start-up."""
    async for attempt in AsyncRetrying(
        retry=retry_if_exception_type(BusUnavailable), wait=wait_fixed(1),
        stop=stop_after_delay(STARTUP_PATIENCE_SECONDS), reraise=True,
    ):
        with attempt:
            return await connect(settings.amqp_url, name)
    raise AssertionError("unreachable")


async def pool_patiently(settings: Settings, size: int) -> asyncpg.Pool:
    """A Postgres pool, waiting up to a minute for the database at start-up."""
    async for attempt in AsyncRetrying(
        retry=retry_if_exception_type(StoreUnavailable), wait=wait_fixed(1),
        stop=stop_after_delay(STARTUP_PATIENCE_SECONDS), reraise=True,
    ):
        with attempt:
            return await create_pool(settings.database_url, max_size=size)
    raise AssertionError("unreachable")


async def run_worker(settings: Settings) -> None:
    connection = await connect_patiently(settings, "casetrail-worker")
    pool = await pool_patiently(settings, 10)
    topology = Topology(settings.namespace)
    runtime = BusWorkerRuntime(
        connection, topology, await Publisher.open(connection),
        default_policy=RetryPolicy(attempts=settings.tool_attempts,
                                   timeout_seconds=settings.tool_timeout_seconds),
    )
    await runtime.start()
    worker = CaseWorker(connection, CaseStore(pool), topology, runtime,
                        models=ModelFactory(settings),
                        concurrency=settings.worker_concurrency,
                        lease_seconds=settings.lease_seconds)
    try:
        await run_until_signal(worker.run)
    finally:
        await runtime.close()
        await connection.close()
        await pool.close()


async def run_consumer(settings: Settings) -> None:
    connection = await connect_patiently(settings, "casetrail-consumer")
    pool = await pool_patiently(settings, 4)
    consumer = EventLogConsumer(
        connection, EventLogWriter(pool), Topology(settings.namespace),
        prefetch=settings.consumer_prefetch, batch_size=settings.consumer_batch_size,
        linger=settings.consumer_linger_ms / 1000,
    )
    try:
        await run_until_signal(consumer.run)
    finally:
        await connection.close()
        await pool.close()
    log.info("consumer stopped: %s", consumer.stats)


async def run_capability_worker(
    settings: Settings, names: Sequence[str], concurrency: int | None
) -> None:
    connection = await connect_patiently(settings, "casetrail-capability-worker")
    worker = CapabilityWorker(
        connection, Topology(settings.namespace), [CAPABILITIES[n] for n in names],
        concurrency=concurrency or settings.capability_concurrency,
    )
    try:
        await run_until_signal(worker.run)
    finally:
        await connection.close()


__all__ = [
    "connect_patiently", "pool_patiently", "run_capability_worker", "run_consumer",
    "run_worker",
]
