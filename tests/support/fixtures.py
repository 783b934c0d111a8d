"""The fixtures of the tiers that run against the real services (tests/integration,
tests/browser; each tier's conftest takes them from here): the test namespace set up on
the real Postgres and RabbitMQ as ``casetrail setup`` does it, dropped afterwards;
connections and pools as each component's own identity; an API key; Chromium."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aio_pika
import asyncpg
import httpx
import pytest
from playwright.async_api import Browser, async_playwright

from casetrail.adapters.bus.topology import Topology
from casetrail.adapters.store import ApiKeyStore, KeyRegistry, component_pool, create_pool
from casetrail.agents import CAPABILITIES
from casetrail.config import Component, Settings
from casetrail.consumers.admission import Admission, KeyRing
from casetrail.contract.integrity import Signer
from casetrail.ops.setup import remove, setup
from tests.support.helpers import CapabilityConnections
from tests.support.stack import InProcessStack


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
