"""The publisher against the real broker: many publishes in flight on one channel,
each settled by its own ack, nack or return. ``make test`` runs these with the fast
path on and again with ``CASETRAIL_AMQP_FASTPATH=off``."""

from __future__ import annotations

import asyncio
import uuid

import aio_pika

from casetrail.adapters.bus.publisher import Publisher
from casetrail.adapters.bus.topology import Topology
from casetrail.config import Settings
from casetrail.errors import BusUnavailable, PublishRejected
from tests.support.helpers import drain


async def test_publishes_in_flight_together_are_each_settled_by_their_own_confirm(
    amqp: aio_pika.abc.AbstractRobustConnection, queue: aio_pika.abc.AbstractQueue
) -> None:
    """Every seventh of 300 concurrent publishes is unroutable: exactly those fail, and
    exactly the others arrive, each once, with its own properties and body."""
    publisher = await Publisher.open(amqp)

    async def one(i: int) -> str:
        key = f"no-such-queue-{i}" if i % 7 == 0 else queue.name
        await publisher.publish("", key, f'{{"n":{i}}}'.encode(), message_id=f"m-{i}",
                                message_type="PROBE", correlation_id=str(i))
        return f"m-{i}"

    results = await asyncio.gather(*(one(i) for i in range(300)), return_exceptions=True)
    rejected = {i for i, r in enumerate(results) if isinstance(r, PublishRejected)}
    assert rejected == {i for i in range(300) if i % 7 == 0}
    assert all(isinstance(r, str) for i, r in enumerate(results) if i not in rejected)

    arrived = await drain(queue, 300 - len(rejected))
    assert sorted(int(m.correlation_id or "") for m in arrived) == \
        sorted(set(range(300)) - rejected)
    for message in arrived:
        n = int(message.correlation_id or "")
        assert message.message_id == f"m-{n}"
        assert message.body == f'{{"n":{n}}}'.encode()
        assert message.type == "PROBE"
        assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
    await asyncio.sleep(0.2)
    assert await queue.get(fail=False) is None  # nothing more arrived
    await publisher.channel.close()


async def test_a_nacked_publish_raises_and_the_ones_around_it_do_not(
    amqp: aio_pika.abc.AbstractRobustConnection, topology: Topology
) -> None:
    channel = await amqp.channel()
    full = await channel.declare_queue(
        f"{topology.namespace}.publisher-full-{uuid.uuid4().hex[:8]}", exclusive=True,
        arguments={"x-max-length": 2, "x-overflow": "reject-publish"})
    publisher = await Publisher.open(amqp)
    results = await asyncio.gather(
        *(publisher.publish("", full.name, b"x", message_id=f"n-{i}") for i in range(5)),
        return_exceptions=True)
    assert results[:2] == [None, None]
    assert all(isinstance(r, PublishRejected) for r in results[2:]), results
    await full.delete(if_unused=False, if_empty=False)
    await channel.close()
    await publisher.channel.close()


async def test_a_body_larger_than_a_frame_arrives_whole(
    amqp: aio_pika.abc.AbstractRobustConnection, queue: aio_pika.abc.AbstractQueue
) -> None:
    publisher = await Publisher.open(amqp)
    body = bytes(range(256)) * 2_000  # 512 KB, several frames at the broker's frame size
    await publisher.publish("", queue.name, body, message_id="big")
    (message,) = await drain(queue, 1)
    assert message.body == body
    await publisher.channel.close()


async def test_a_channel_closed_by_the_broker_fails_its_publish_and_the_rest_recover(
    settings: Settings, queue: aio_pika.abc.AbstractQueue
) -> None:
    """A publish to a missing exchange makes the broker close the channel. That
    publish gives up after its retry time; the ones in flight beside it are retried
    on the reopened channel and all arrive (at least once).

    A frame that crosses the channel's close makes the broker close the whole
    connection (504 "expected 'channel.open'"), so the publisher has a connection of
    its own: the private queue, exclusive to the fixture's connection, would be
    deleted with it, and the confirmed messages with the queue."""
    own = await aio_pika.connect_robust(settings.amqp_url)
    publisher = await Publisher.open(own, retry_seconds=1.5)
    good = [publisher.publish("", queue.name, str(i).encode(), message_id=f"g-{i}")
            for i in range(40)]
    bad = publisher.publish("no-such-exchange-here", "k", b"x", message_id="bad")
    results = await asyncio.gather(*good, bad, return_exceptions=True)
    assert isinstance(results[-1], BusUnavailable)
    assert results[:-1] == [None] * 40
    arrived = await drain(queue, 40)
    assert {m.body for m in arrived} == {str(i).encode() for i in range(40)}
    await own.close()
