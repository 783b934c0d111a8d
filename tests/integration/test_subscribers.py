"""Per-tenant subscribers on the real broker: one identity reads one bounded queue of
its tenant's events and can declare, bind, write or read nothing else; a stalled one
loses its own oldest events and slows nobody's cases."""

from __future__ import annotations

import asyncio
import base64
import hashlib
from typing import Any

import aio_pika
import aiormq
import asyncpg
import httpx
import orjson
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from casetrail.adapters.bus.topology import Topology
from casetrail.adapters.store import ApiKeyStore
from casetrail.agents.loan_officer import SAMPLE_APPLICATIONS
from casetrail.config import Settings
from casetrail.contract.integrity import Signer
from casetrail.ops import subscribers
from casetrail.trail.admission import Admission
from tests.support.helpers import ended, wait_until
from tests.support.stack import InProcessStack, module_stack

stack = module_stack(worker_concurrency=4)


async def case_of(stack: InProcessStack, pool: asyncpg.Pool, tenant: str) -> str:
    _, key = await ApiKeyStore(pool).create(tenant, ("cases:start", "cases:read"), "feed")
    async with httpx.AsyncClient(base_url=stack.base_url,
                                 headers={"Authorization": f"Bearer {key}"}) as client:
        case_id: str = (await client.post("/cases", json={
            "agent": "loan-officer", "input": SAMPLE_APPLICATIONS[0]})).json()["caseId"]
        await ended(client, case_id)
    return case_id


async def drained(queue: aio_pika.abc.AbstractQueue) -> list[Any]:
    got = []
    while (message := await queue.get(fail=False, no_ack=True)) is not None:
        got.append(message)
    return got


async def test_a_subscriber_reads_its_tenants_events_and_can_do_nothing_else(
    settings: Settings, stack: InProcessStack, pool: asyncpg.Pool, admission: Admission,
    signer: Signer,
) -> None:
    url = await subscribers.create(settings, "acme-feed", "acme")
    mine = await case_of(stack, pool, "acme")
    theirs = await case_of(stack, pool, "globex")
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel()
        queue = await channel.get_queue(subscribers.queue_of(settings, "acme-feed"),
                                        ensure=False)

        async def the_whole_case() -> list[Any] | None:
            await asyncio.sleep(0.2)
            got = await drained(queue)
            seen.extend(got)
            return seen if any(m.routing_key.endswith("CASE_COMPLETED") for m in seen) else None

        seen: list[Any] = []
        await wait_until(the_whole_case, timeout=15)
        keys = {m.routing_key for m in seen}
        assert all(k.startswith(f"case.acme.{mine}.") for k in keys), keys
        assert not any(theirs in k for k in keys)
        assert all(m.user_id == settings.broker_user("worker") for m in seen)
        for message in seen:  # each as signed: checked as the consumer checks it
            admission.authenticate(message.body, message.headers or {}, message.user_id)
            # ... and as the README's subscriber example checks it, with nothing of ours.
            integrity = message.headers["x-casetrail-integrity"]
            integrity = orjson.loads(integrity) if isinstance(integrity, bytes) else integrity
            digest = hashlib.sha256(integrity["prevHash"].encode() + b"\n" + message.body)
            assert digest.hexdigest() == integrity["hash"]
            Ed25519PublicKey.from_public_bytes(signer.public_key).verify(
                base64.urlsafe_b64decode(integrity["sig"] + "=="),
                bytes.fromhex(integrity["hash"]))
        topology = Topology(settings.namespace)
        with pytest.raises(aiormq.exceptions.ChannelAccessRefused):
            await (await connection.channel()).declare_queue("", exclusive=True)
        with pytest.raises(aiormq.exceptions.ChannelAccessRefused):
            own = await (await connection.channel()).get_queue(
                subscribers.queue_of(settings, "acme-feed"), ensure=False)
            await own.bind(topology.events_exchange, routing_key="case.globex.#")
        with pytest.raises(aiormq.exceptions.ChannelAccessRefused):
            log = await (await connection.channel()).get_queue(topology.event_log_queue,
                                                               ensure=False)
            await log.get(fail=False, no_ack=True)
        with pytest.raises(aiormq.exceptions.ChannelAccessRefused):
            writer = await connection.channel(publisher_confirms=True)
            exchange = await writer.get_exchange(topology.events_exchange, ensure=False)
            await exchange.publish(aio_pika.Message(b"{}"), routing_key="case.acme.x.y")
    finally:
        await connection.close()
    listed = {s.name: s for s in await subscribers.listed(settings)}
    assert listed["acme-feed"].tenant == "acme" and listed["acme-feed"].revoked_at is None
    assert await subscribers.revoke(settings, "acme-feed") is True
    with pytest.raises(aiormq.exceptions.ProbableAuthenticationError):
        await aio_pika.connect(url)
    assert await subscribers.revoke(settings, "acme-feed") is False


async def test_a_stalled_subscriber_loses_its_oldest_events_and_slows_no_case(
    settings: Settings, stack: InProcessStack, pool: asyncpg.Pool,
) -> None:
    bounded = settings.model_copy(update={"subscriber_max_events": 3})
    await subscribers.create(bounded, "stalled", "initech")
    try:
        for _ in range(2):  # ~12 events for a queue of 3 that nobody reads
            await case_of(stack, pool, "initech")
        depth = await wait_until(lambda: _depth(settings), timeout=10)
        assert depth <= 3
    finally:
        await subscribers.revoke(settings, "stalled")


async def _depth(settings: Settings) -> int:
    connection = await aio_pika.connect(settings.amqp_url)
    try:
        channel = await connection.channel()
        queue = await channel.declare_queue(subscribers.queue_of(settings, "stalled"),
                                            passive=True)
        count = queue.declaration_result.message_count
        return int(count) if count else 0
    finally:
        await connection.close()
