"""Running the casetrail components for tests: in this event loop (fast), or as real
processes (as production runs them)."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import tempfile
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg
import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from casetrail.adapters.bus.connection import connect
from casetrail.adapters.bus.publisher import Publisher
from casetrail.adapters.bus.rpc import BusWorkerRuntime, RetryPolicy
from casetrail.adapters.bus.topology import Topology
from casetrail.adapters.store import (
    ApiKeyStore,
    CapabilityKeyRegistry,
    CaseSecrets,
    CaseStore,
    KeyRegistry,
    component_pool,
    create_pool,
)
from casetrail.adapters.store.writer import EventLogWriter
from casetrail.agents import CAPABILITIES
from casetrail.api import create_app
from casetrail.api.streams import STREAMS_CLOSE_SECONDS
from casetrail.components.capability_worker import CapabilityWorker
from casetrail.components.supervisor import component_command
from casetrail.components.worker import Caps, CaseWorker
from casetrail.components.worker_duties import worker_duties
from casetrail.config import Settings
from casetrail.consumers.admission import Admission, KeyRing
from casetrail.consumers.event_log import EventLogConsumer
from casetrail.ops.setup import remove, setup
from casetrail.privacy.sealing import CapabilityKeys, private_key
from casetrail.privacy.sensitive import Vault
from casetrail.providers import ModelFactory
from casetrail.trail.keyfile import worker_signer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@asynccontextmanager
async def serve_api(settings: Settings, app: FastAPI | None = None) -> AsyncIterator[str]:
    """A real uvicorn serving the API (``app``, else one made for ``settings``) on a free
    port; yields its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app or create_app(settings), host="127.0.0.1",
                                           port=port,
                                           log_level="warning", lifespan="on",
                                           timeout_keep_alive=settings.api_keep_alive_seconds,
                                           timeout_graceful_shutdown=STREAMS_CLOSE_SECONDS))
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


@dataclass
class InProcessStack:
    base_url: str
    worker: CaseWorker
    consumer: EventLogConsumer
    capability_workers: list[CapabilityWorker]
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    app: FastAPI | None = None


@asynccontextmanager
async def in_process_stack(
    settings: Settings, amqp: aio_pika.abc.AbstractRobustConnection, pool: asyncpg.Pool,
    worker_concurrency: int = 8,
) -> AsyncIterator[InProcessStack]:
    """The components in this event loop, each connected as its own identity (the
    ``amqp`` and ``pool`` of the tests are the bootstrap user's, unused here)."""
    topology = Topology(settings.namespace)
    async with AsyncExitStack() as resources:
        worker_id, consumer_id = settings.identity("worker"), settings.identity("consumer")
        connections = {}
        for component in ("worker", "consumer"):
            connection = await connect(settings.identity(component).amqp_url,
                                       f"casetrail-{component}")
            resources.push_async_callback(connection.close)
            connections[component] = connection
        worker_pool = await component_pool(worker_id, 4)
        resources.push_async_callback(worker_pool.close)
        consumer_pool = await component_pool(consumer_id, 4)
        resources.push_async_callback(consumer_pool.close)
        runtime = BusWorkerRuntime(
            connections["worker"], topology, await Publisher.open(connections["worker"]),
            settings.capability_user, CapabilityKeys(CapabilityKeyRegistry(worker_pool).all),
            default_policy=RetryPolicy(attempts=2, timeout_seconds=2.0))
        await runtime.start()
        resources.push_async_callback(runtime.close)
        models = ModelFactory(settings)
        resources.push_async_callback(models.aclose)
        signer = worker_signer(settings)  # registered by setup, as an operator would
        worker = CaseWorker(connections["worker"], CaseStore(worker_pool), topology, runtime,
                            signer, settings.broker_user("api"),
                            CaseSecrets(worker_pool, Vault.from_text(settings.master_key_text())),
                            KeyRegistry(worker_pool), Caps.from_settings(settings),
                            models=models, concurrency=worker_concurrency,
                            lease_seconds=settings.lease_seconds, shutdown_grace=1.0,
                            sweep_seconds=settings.sweep_seconds,
                            duties=worker_duties(settings),
                            review_policy=settings.review_policy,
                            review_deadline_seconds=settings.review_deadline_seconds)
        ring = KeyRing(KeyRegistry(consumer_pool))
        await ring.refresh(force=True)
        consumer = EventLogConsumer(connections["consumer"], EventLogWriter(consumer_pool),
                                    topology, Admission(settings.broker_user("worker"), ring),
                                    linger=0.002)
        capabilities = []
        for capability in CAPABILITIES.values():  # each as its own broker user
            connection = await connect(settings.capability_identity(capability.name).amqp_url,
                                       f"casetrail-capability-{capability.name}")
            resources.push_async_callback(connection.close)
            key = settings.capability_sealing_key(capability.name)
            assert key is not None  # setup made one
            capabilities.append(CapabilityWorker(
                connection, topology, [capability],
                sealing_keys={capability.name: private_key(key, capability.name)}))
        stop = asyncio.Event()
        readies = [asyncio.Event() for _ in range(2 + len(capabilities))]
        tasks = [
            asyncio.create_task(worker.run(stop, readies[0])),
            asyncio.create_task(consumer.run(stop, readies[1])),
            *(asyncio.create_task(serving.run(stop, ready))
              for serving, ready in zip(capabilities, readies[2:], strict=True)),
        ]
        await asyncio.wait_for(asyncio.gather(*(r.wait() for r in readies)), 20)
        try:
            app = create_app(settings)
            async with serve_api(settings, app) as base_url:
                yield InProcessStack(base_url, worker, consumer, capabilities, stop, app)
        finally:
            stop.set()
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)


def module_stack(worker_concurrency: int) -> Any:
    """A module-scoped ``stack`` fixture: an in-process stack whose worker runs
    ``worker_concurrency`` cases at once (each test module sizes its own)."""

    @pytest.fixture(scope="module")
    async def stack(
        settings: Settings, amqp: aio_pika.abc.AbstractRobustConnection, pool: asyncpg.Pool
    ) -> AsyncIterator[InProcessStack]:
        async with in_process_stack(settings, amqp, pool,
                                    worker_concurrency=worker_concurrency) as running:
            yield running

    return stack


def other_namespace(settings: Settings, suffix: str) -> Settings:
    """Settings for a second stack beside the tests' own: its own namespace, database
    and secrets file (``casetrail setup`` makes its identities; remove it afterwards
    with ``casetrail.ops.setup.remove``)."""
    secrets_file = Path(settings.secrets_path()).with_name(f"{suffix}.identities.json")
    return settings.model_copy(update={
        "namespace": f"{settings.namespace}-{suffix}",
        "database_url": f"{settings.database_url}_{suffix}",
        "secrets_file": str(secrets_file)})


@asynccontextmanager
async def namespace_of_its_own(settings: Settings, suffix: str, **updates: Any
                               ) -> AsyncIterator[tuple[Settings, asyncpg.Pool, str]]:
    """A namespace set up beside the tests' own (no other module's case reaches its
    components): its settings, a bootstrap pool to its database and an API key of the
    default tenant; removed afterwards."""
    from tests.support.fixtures import TEST_SCOPES, TESTS_APPLICATION

    own = other_namespace(settings, suffix).model_copy(update=updates)
    await setup(own)
    pool = await create_pool(own.database_url, max_size=2, name=TESTS_APPLICATION)
    try:
        _, key = await ApiKeyStore(pool).create("default", TEST_SCOPES, f"{suffix} tests")
        yield own, pool, key
    finally:
        await pool.close()
        await remove(own)


async def port_open(port: int) -> bool:
    """Something listens on 127.0.0.1:``port``."""
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    writer.close()
    return True


@asynccontextmanager
async def component_processes(own: Settings, key: str, **env: str
                              ) -> AsyncIterator[tuple[httpx.AsyncClient,
                                                       dict[str, subprocess.Popen[bytes]]]]:
    """API, worker, consumer and capability worker as processes of the namespace
    ``own`` (with ``env``), and a client of its API holding ``key``; stopped cleanly (and
    checked to be) after the block, killed if it failed."""
    from tests.support.helpers import wait_until

    port = free_port()
    children = {name: spawn(own, *command, **env) for name, command in {
        "api": ("api", "--port", str(port)), "worker": ("worker",),
        "consumer": ("consumer",), "capability": ("capability-worker",)}.items()}
    base_url = f"http://127.0.0.1:{port}"
    try:
        await wait_until(lambda: api_ready(base_url), timeout=30, interval=0.2)
        async with httpx.AsyncClient(base_url=base_url, timeout=10, headers={
                "Authorization": f"Bearer {key}"}) as client:
            yield client, children
        await stop_cleanly(children)
    finally:
        kill_leftovers(children)


async def api_ready(base_url: str) -> bool:
    try:
        async with httpx.AsyncClient(base_url=base_url) as client:
            return (await client.get("/readyz")).status_code == 200
    except httpx.TransportError:
        return False


def kill_leftovers(children: dict[str, subprocess.Popen[bytes]]) -> None:
    """Kill what a failed test left running (a clean stop is ``stop_cleanly``)."""
    for child in children.values():
        if child.poll() is None:
            child.kill()
            child.wait()


async def stop_all(children: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each child and wait for it (kill and fail after 20 s)."""
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    for child in children:
        try:
            await asyncio.to_thread(child.wait, 20)
        except subprocess.TimeoutExpired:
            child.kill()
            raise


async def stop_cleanly(children: dict[str, subprocess.Popen[bytes]]) -> None:
    """Stop the components and check each exited cleanly (its log's tail if not)."""
    await stop_all(list(children.values()))
    for name, child in children.items():
        # uvicorn re-raises the SIGTERM it handled once it has shut down cleanly.
        clean = (0, -signal.SIGTERM) if name == "api" else (0,)
        log = Path(child.log_path).read_text()[-2000:]  # type: ignore[attr-defined]  # noqa: ASYNC240
        assert child.returncode in clean, f"{name} exited {child.returncode}: {log}"


def spawn(settings: Settings, *args: str, **extra: str) -> subprocess.Popen[bytes]:
    """``casetrail ARGS`` as a real child process in the test namespace; its log goes to
    a temporary file (``child.log_path``) so a chatty child never blocks on a pipe."""
    log = tempfile.NamedTemporaryFile(prefix=f"casetrail-{args[0]}-", suffix=".log",  # noqa: SIM115
                                      delete=False)
    child = subprocess.Popen(
        component_command(*args), env=settings.environment(**extra),
        stdout=log, stderr=subprocess.STDOUT,
    )
    child.log_path = log.name  # type: ignore[attr-defined]
    log.close()
    return child


def stop_worker(children: dict[str, subprocess.Popen[bytes]]) -> None:
    """Stop the worker process an earlier test left in ``children``, if any."""
    earlier = children.pop("worker", None)
    if earlier is not None and earlier.poll() is None:
        earlier.terminate()
        earlier.wait(30)


def replace_worker(settings: Settings, children: dict[str, subprocess.Popen[bytes]],
                   **extra: str) -> subprocess.Popen[bytes]:
    """A worker process of the test's own (``children["worker"]``), started once the one
    an earlier test left has stopped."""
    stop_worker(children)
    worker = children["worker"] = spawn(settings, "worker", **extra)
    return worker
