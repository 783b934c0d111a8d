"""Test fixtures: a private database and a private bus namespace per test session,
on the real Postgres and the real RabbitMQ, dropped afterwards.

A guard makes any name lookup of a non-local host fail, so no test can reach a
real LLM provider (or anything else off this machine).
"""

from __future__ import annotations

import os
import shutil
import socket
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aio_pika
import asyncpg
import httpx
import pytest
from playwright.async_api import Browser, async_playwright

from casetrail.adapters.bus import fastpath
from casetrail.adapters.bus.topology import Topology
from casetrail.adapters.store import ApiKeyStore, KeyRegistry, component_pool, create_pool
from casetrail.agents import CAPABILITIES
from casetrail.components.sequencer import write_log_key
from casetrail.config import Component, Settings, TenantQuota
from casetrail.consumers.admission import Admission, KeyRing
from casetrail.contract.integrity import Signer
from casetrail.ledger.note import NoteSigner
from casetrail.ops.setup import remove, setup
from casetrail.trail.keyfile import worker_signer, write_signer
from tests.helpers import CapabilityConnections
from tests.stack import InProcessStack

_LOCAL = {"localhost", "127.0.0.1", "::1", "0.0.0.0", ""}
_real_getaddrinfo = socket.getaddrinfo


BLOCKED_HOSTS: list[str] = []
"""Hosts a test tried to reach; any entry fails that test (see ``_no_outside_hosts``)."""


def _guarded_getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
    name = host.decode() if isinstance(host, bytes) else (host or "")
    if name not in _LOCAL and not name.startswith("127."):
        BLOCKED_HOSTS.append(name)
        raise socket.gaierror(f"tests must not reach {name!r}: only this machine is allowed")
    return _real_getaddrinfo(host, *args, **kwargs)


socket.getaddrinfo = _guarded_getaddrinfo


@pytest.fixture(autouse=True)
def _no_outside_hosts() -> Iterator[None]:
    """Fail any test that tried to reach a host off this machine (a real provider)."""
    yield
    tried = list(BLOCKED_HOSTS)
    BLOCKED_HOSTS.clear()
    assert not tried, f"a test tried to reach {tried}"


BASE_AMQP = os.environ.get("CASETRAIL_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
BASE_DB = os.environ.get("CASETRAIL_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/casetrail")


LOG_ORIGIN = "casetrail.test/log"
"""The tests' transparency log (one key for every namespace the tests make)."""


@pytest.fixture(scope="session")
def settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    suffix = uuid.uuid4().hex[:8]
    db_url = BASE_DB.rsplit("/", 1)[0] + f"/casetrail_test_{suffix}"
    key_file = tmp_path_factory.mktemp("keys") / "worker-signing-key.pem"
    write_signer(key_file, Signer.generate())  # the tests make their own keys
    namespace = f"casetrail-test-{suffix}"
    action_key = key_file.parent / "api-action-key.pem"
    write_signer(action_key, Signer.generate())  # the API's: it signs persons' actions
    log_key = key_file.parent / "log-key"
    write_log_key(log_key, NoteSigner.generate(LOG_ORIGIN))
    return Settings(
        amqp_url=BASE_AMQP,
        database_url=db_url,
        namespace=namespace,
        log_key_file=str(log_key),
        log_origin=LOG_ORIGIN,
        checkpoint_seconds=0.2,
        consumer_linger_ms=2.0,
        lease_seconds=3.0,
        tool_timeout_seconds=2.0,
        signing_key_file=str(key_file),
        action_key_file=str(action_key),
        secrets_file=str(key_file.parent / "identities.json"),
        bench_mode=True,  # the tests use slow scripted models (latencyMs)
        # Any free port for each component's metrics: beside a demo stack, and beside
        # each other (the tests start several of each).
        api_metrics_port=0, worker_metrics_port=0, consumer_metrics_port=0,
        capability_metrics_port=0, ledger_metrics_port=0,
        # The suite starts many cases in a minute as one tenant (schemathesis alone
        # hundreds); two tenants keep small limits for the quota tests.
        tenant_max_starts_per_minute=100_000, tenant_max_key_searches_per_minute=100_000,
        # One key reads many streams at once in the stream tests (the per-key limit has
        # its own test, on an API with a limit of 2).
        stream_max_per_key=200,
        # The tests' own capabilities, beside the agents': a queue and a user each.
        extra_capabilities=["nobody-home", "slow-echo"],
        tenant_quotas={"tiny": TenantQuota(max_active_cases=1),
                       "hasty": TenantQuota(max_starts_per_minute=2)},
    )


@pytest.fixture(scope="session")
def signer(settings: Settings) -> Signer:
    """The worker's key in these tests (registered in the test database by ``pool``)."""
    return worker_signer(settings)


@pytest.fixture(scope="session")
def topology(settings: Settings) -> Topology:
    return Topology(settings.namespace)


@pytest.fixture(scope="session")
async def database(settings: Settings) -> AsyncIterator[str]:
    """The test namespace, set up as ``casetrail setup`` does it for a live one: its own
    database, roles and broker users, every component with its least privilege."""
    try:
        await setup(settings)
        yield settings.database_url
    finally:  # a setup that failed half-way leaves nothing behind either
        await remove(settings)


@pytest.fixture(scope="session")
async def pool(database: str, signer: Signer) -> AsyncIterator[asyncpg.Pool]:
    """The tests' own view of the database, as the bootstrap user (to inspect and to
    arrange what no component may do); components get pools of their own roles."""
    pool = await create_pool(database, max_size=10, name=TESTS_APPLICATION)
    await KeyRegistry(pool).register(signer.key_id, signer.public_key)
    yield pool
    await pool.close()


@pytest.fixture(scope="session")
async def admission(pool: asyncpg.Pool, settings: Settings) -> Admission:
    """What an in-process consumer admits: the worker's identity and the registered keys."""
    keys = KeyRing(KeyRegistry(pool))
    await keys.refresh(force=True)
    return Admission(settings.broker_user("worker"), keys)


TESTS_APPLICATION = "casetrail-tests"


@pytest.fixture(scope="session")
async def amqp(settings: Settings, topology: Topology, database: str) -> AsyncIterator[
    aio_pika.abc.AbstractRobustConnection
]:
    """The bootstrap (admin) broker connection: for what only an operator does."""
    connection = await aio_pika.connect_robust(settings.amqp_url)
    channel = await connection.channel()
    await topology.declare(channel)
    yield connection
    channel = await connection.channel()
    await topology.delete_all(channel, [*sorted(CAPABILITIES), "nobody-home", "slow-echo"])
    await connection.close()


def _connection_as(component: Component) -> Any:
    """A session fixture: a broker connection as ``component``'s own user."""

    @pytest.fixture(scope="session")
    async def connection(settings: Settings, amqp: Any
                         ) -> AsyncIterator[aio_pika.abc.AbstractRobustConnection]:
        made = await aio_pika.connect_robust(settings.identity(component).amqp_url)
        yield made
        await made.close()

    return connection


worker_amqp = _connection_as("worker")  # what publishes events
consumer_amqp = _connection_as("consumer")

@pytest.fixture(scope="session")
async def capability_as(settings: Settings, amqp: Any) -> AsyncIterator[CapabilityConnections]:
    """A broker connection as one capability's own user (made once per capability)."""
    made: dict[str, aio_pika.abc.AbstractRobustConnection] = {}

    async def connection(capability: str) -> aio_pika.abc.AbstractRobustConnection:
        if capability not in made:
            made[capability] = await aio_pika.connect_robust(
                settings.capability_identity(capability).amqp_url)
        return made[capability]

    yield connection
    for opened in made.values():
        await opened.close()


@pytest.fixture(scope="session")
async def consumer_pool(settings: Settings, pool: asyncpg.Pool) -> AsyncIterator[asyncpg.Pool]:
    """The consumer's own role (INSERT and SELECT on the log, nothing more)."""
    created = await component_pool(settings.identity("consumer"), 4)
    yield created
    await created.close()


@pytest.fixture(scope="session", autouse=True)
def _amqp_fastpath(settings: Settings) -> None:
    """In-process components take the fast path as the real ones do, unless the run
    says ``CASETRAIL_AMQP_FASTPATH=off`` (``make test`` runs the bus tests both ways)."""
    fastpath.enable(settings.amqp_fastpath)


@pytest.fixture
async def queue(amqp: aio_pika.abc.AbstractRobustConnection, topology: Topology
                ) -> AsyncIterator[aio_pika.abc.AbstractQueue]:
    """A private queue, reached through the default exchange by its name."""
    channel = await amqp.channel()
    name = f"{topology.namespace}.private-{uuid.uuid4().hex[:8]}"
    declared = await channel.declare_queue(name, exclusive=True)
    yield declared
    await declared.delete(if_unused=False, if_empty=False)
    await channel.close()


TEST_SCOPES = ("cases:start", "cases:read", "cases:cancel", "models:override")


@pytest.fixture(scope="session")
async def api_key(pool: asyncpg.Pool) -> str:
    """An API key of the default tenant with every scope a case needs."""
    _, key = await ApiKeyStore(pool).create("default", TEST_SCOPES, "tests")
    return key


@pytest.fixture(scope="session")
def auth_headers(api_key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"}


@pytest.fixture
async def client(stack: InProcessStack, auth_headers: dict[str, str]
                 ) -> AsyncIterator[httpx.AsyncClient]:
    """HTTP to the API of the module's ``stack`` (a module defines its own, sized for it),
    as the default tenant's key."""
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=10,
                                 headers=auth_headers) as http:
        yield http


def chromium() -> str:
    """Debian's Chromium (``make test`` installs it); Playwright's own download does not
    work here, so the browser is never fetched by the tests."""
    found = os.environ.get("CASETRAIL_CHROMIUM") or shutil.which("chromium") \
        or shutil.which("chromium-browser")
    if found is None:
        pytest.fail("Chromium is not installed: `apt-get install chromium` (make test does)")
    return found


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Browser]:
    """Debian's Chromium, one per test module that asks for it."""
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=chromium(),
                                                    args=["--no-sandbox"])
        yield launched
        await launched.close()
