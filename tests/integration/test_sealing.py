"""Sensitive values in tool requests (real RabbitMQ, real Postgres): a request carries
placeholders and the values sealed to its capability's own key, so no queue, expired
request or dead letter holds them in clear; a capability with no registered key is
never sent them."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import aio_pika
import asyncpg
import orjson
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from casetrail.adapters.bus.publisher import Publisher
from casetrail.adapters.bus.rpc import BusWorkerRuntime, RetryPolicy
from casetrail.adapters.bus.topology import Topology
from casetrail.adapters.store import CapabilityKeyRegistry
from casetrail.config import Settings
from casetrail.contract.commands import ToolRequest
from casetrail.errors import PermanentError
from casetrail.privacy.sealing import CapabilityKeys, open_sealed, private_key
from casetrail.privacy.sensitive import Redaction
from tests.support.helpers import wait_until

NAME = "Jane Roe"
REDACTION = Redaction.of({"[pii:name]": NAME, "[pii:customerId]": "C-0042"})


async def _no_keys() -> dict[str, bytes]:
    return {}


@pytest.fixture
async def runtime(settings: Settings, worker_amqp: aio_pika.abc.AbstractRobustConnection,
                  pool: asyncpg.Pool) -> AsyncIterator[BusWorkerRuntime]:
    rpc = BusWorkerRuntime(
        worker_amqp, Topology(settings.namespace), await Publisher.open(worker_amqp),
        settings.capability_user, CapabilityKeys(CapabilityKeyRegistry(pool).all),
        default_policy=RetryPolicy(attempts=1, timeout_seconds=1.5))
    await rpc.start()
    yield rpc
    await rpc.close()


def key_of(settings: Settings, capability: str) -> X25519PrivateKey:
    text = settings.capability_sealing_key(capability)
    assert text is not None  # setup made one and registered its public half
    return private_key(text, capability)


async def test_a_request_holds_placeholders_and_values_only_its_capability_opens(
    settings: Settings, runtime: BusWorkerRuntime, amqp: aio_pika.abc.AbstractRobustConnection,
    pool: asyncpg.Pool,
) -> None:
    """Nobody serves ``nobody-home``: the test takes the request off its queue as the
    admin would see it, then lets a second one expire there unserved."""
    topology = Topology(settings.namespace)
    call_id = str(uuid.uuid4())
    call = asyncio.create_task(runtime.execute(
        "nobody-home", {"name": NAME, "note": f"screen {NAME}", "country": "NL"},
        call_id=call_id, redaction=REDACTION))
    channel = await amqp.channel()
    queue = await channel.get_queue(topology.capability_queue("nobody-home"), ensure=False)
    message = await wait_until(lambda: queue.get(fail=False, no_ack=True))
    assert NAME.encode() not in message.body and b"C-0042" not in message.body
    request = ToolRequest.model_validate(orjson.loads(message.body))
    assert request.args == {"name": "[pii:name]", "note": "screen [pii:name]", "country": "NL"}
    assert request.sealed is not None
    # Only the values the call holds, and only with nobody-home's key, for this call.
    opened = open_sealed(key_of(settings, "nobody-home"), request.sealed,
                         "nobody-home", call_id)
    assert opened == {"[pii:name]": NAME}
    with pytest.raises(PermanentError, match="do not open"):
        open_sealed(key_of(settings, "credit-score"), request.sealed,
                    "nobody-home", call_id)
    with pytest.raises(PermanentError, match="do not open"):  # copied into another call
        open_sealed(key_of(settings, "nobody-home"), request.sealed,
                    "nobody-home", str(uuid.uuid4()))
    result = await asyncio.wait_for(call, 10)
    assert result.error is not None and "timeout" in result.error

    # A request nobody takes in time is dropped by the broker: not dead-lettered, so
    # nothing of it outlives the call (and what was queued held no value in clear).
    expired = await runtime.execute("nobody-home", {"name": NAME}, call_id=str(uuid.uuid4()),
                                    redaction=REDACTION)
    assert expired.error is not None
    await asyncio.sleep(0.5)
    assert await queue.get(fail=False, no_ack=True) is None
    dead = await channel.get_queue(topology.dead_letter_queue, ensure=False)
    held = []  # looked at, not taken: closing the channel hands them back
    while (letter := await dead.get(fail=False, no_ack=False)) is not None:
        held.append(letter.body)
    assert not [body for body in held if NAME.encode() in body]
    await channel.close()


async def test_a_capability_with_no_registered_key_is_never_sent_the_values(
    settings: Settings, worker_amqp: aio_pika.abc.AbstractRobustConnection,
    amqp: aio_pika.abc.AbstractRobustConnection,
) -> None:
    topology = Topology(settings.namespace)
    rpc = BusWorkerRuntime(worker_amqp, topology, await Publisher.open(worker_amqp),
                           settings.capability_user, CapabilityKeys(_no_keys),
                           default_policy=RetryPolicy(attempts=1, timeout_seconds=1))
    await rpc.start()
    try:
        refused = await rpc.execute("nobody-home", {"name": NAME}, call_id=str(uuid.uuid4()),
                                    redaction=REDACTION)
        # A call that holds no sensitive value goes as before.
        plain = asyncio.create_task(rpc.execute("nobody-home", {"name": "nobody"},
                                                call_id=str(uuid.uuid4()),
                                                redaction=REDACTION))
        channel = await amqp.channel()
        queue = await channel.get_queue(topology.capability_queue("nobody-home"), ensure=False)
        only = await wait_until(lambda: queue.get(fail=False, no_ack=True))
        assert ToolRequest.model_validate(orjson.loads(only.body)).sealed is None
        await plain
        assert await queue.get(fail=False, no_ack=True) is None  # the refused one never went
        await channel.close()
    finally:
        await rpc.close()
    assert refused.error is not None and "no sealing key registered" in refused.error
    assert refused.attempts == ()


async def test_setup_registers_each_capabilitys_public_key(
    settings: Settings, pool: asyncpg.Pool,
) -> None:
    registered = await CapabilityKeyRegistry(pool).all()
    for capability in ("credit-score", "sanctions-screening", "nobody-home"):
        key = key_of(settings, capability)
        assert registered[capability] == key.public_key().public_bytes_raw()
