"""Subscriptions against the real broker: deliveries handed over in line, in order,
beside an ordinary consumer on the same channel."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Callable

import aio_pika
import pytest
from aiormq.abc import DeliveredMessage

from casetrail.adapters.bus.dead_letter import REASON_HEADER
from casetrail.adapters.bus.deliveries import Delivery, Subscription, TaskPerDelivery
from casetrail.adapters.bus.publisher import Publisher
from casetrail.adapters.bus.topology import Topology
from casetrail.errors import Reject, TransientError
from tests.support.helpers import wait_until


@pytest.fixture
async def channel(amqp: aio_pika.abc.AbstractRobustConnection
                  ) -> AsyncIterator[aio_pika.abc.AbstractRobustChannel]:
    channel = await amqp.channel()
    assert isinstance(channel, aio_pika.abc.AbstractRobustChannel)
    yield channel
    await channel.close()


async def private_queue(channel: aio_pika.abc.AbstractChannel, topology: Topology) -> str:
    name = f"{topology.namespace}.deliveries-{uuid.uuid4().hex[:8]}"
    await channel.declare_queue(name, exclusive=True)
    return name


async def wait_for(condition: Callable[[], bool]) -> None:
    async def check() -> bool:
        return condition()

    await wait_until(check, timeout=10, interval=0.01)


async def test_deliveries_reach_the_handler_in_order_beside_an_ordinary_consumer(
    amqp: aio_pika.abc.AbstractRobustConnection,
    channel: aio_pika.abc.AbstractRobustChannel,
    topology: Topology,
) -> None:
    mine, theirs = await private_queue(channel, topology), await private_queue(
        channel, topology)
    got: list[Delivery] = []
    subscription = Subscription(channel, mine, got.append)
    await subscription.start()
    raw = await channel.get_underlay_channel()
    ordinary: list[bytes] = []

    async def consume(message: DeliveredMessage) -> None:
        ordinary.append(message.body)
        await raw.basic_ack(message.delivery_tag or 0)

    await raw.basic_consume(theirs, consume)
    publisher = await Publisher.open(amqp)
    await asyncio.gather(*(
        publisher.publish("", mine if i % 3 else theirs, f'{{"n":{i}}}'.encode(),
                          message_id=f"m-{i}", message_type="PROBE")
        for i in range(300)))
    await wait_for(lambda: len(got) == 200 and len(ordinary) == 100)
    assert [d.message_id for d in got] == [f"m-{i}" for i in range(300) if i % 3]
    assert [d.body for d in got] == [f'{{"n":{i}}}'.encode() for i in range(300) if i % 3]
    assert {d.routing_key for d in got} == {mine} and {d.type for d in got} == {"PROBE"}
    assert ordinary == [f'{{"n":{i}}}'.encode() for i in range(0, 300, 3)]
    await got[-1].ack(multiple=True)
    await subscription.cancel()
    await publisher.channel.close()


async def test_a_failing_handler_is_logged_and_later_deliveries_still_arrive(
    amqp: aio_pika.abc.AbstractRobustConnection,
    channel: aio_pika.abc.AbstractRobustChannel,
    topology: Topology,
    caplog: pytest.LogCaptureFixture,
) -> None:
    queue = await private_queue(channel, topology)
    got: list[str | None] = []

    def handle(delivery: Delivery) -> None:
        if delivery.message_id == "bad":
            raise RuntimeError("handler broke")
        got.append(delivery.message_id)

    subscription = Subscription(channel, queue, handle)
    await subscription.start()
    publisher = await Publisher.open(amqp)
    for message_id in ("a", "bad", "b"):
        await publisher.publish("", queue, b"{}", message_id=message_id)
    with caplog.at_level(logging.ERROR, logger="casetrail.bus"):
        await wait_for(lambda: got == ["a", "b"])
    assert "delivery handler failed" in caplog.text
    assert "handler broke" in caplog.text
    await subscription.cancel()
    await publisher.channel.close()


async def test_what_a_handler_raises_decides_how_its_message_is_settled(
    amqp: aio_pika.abc.AbstractRobustConnection,
    channel: aio_pika.abc.AbstractRobustChannel,
    topology: Topology,
) -> None:
    """Returning acks; ``Reject`` dead-letters with the reason; a ``TransientError``
    hands the message back, and the broker delivers it again; anything else (a bug) is
    dead-lettered with the exception as its reason, never left unsettled."""
    queue = await private_queue(channel, topology)
    seen: list[tuple[str | None, bool]] = []

    async def handle(delivery: Delivery) -> None:
        seen.append((delivery.message_id, delivery.raw.redelivered or False))
        if delivery.message_id == "poison":
            raise Reject("poison: cannot be read")
        if delivery.message_id == "flaky" and not delivery.raw.redelivered:
            raise TransientError("database away")
        if delivery.message_id == "buggy":
            raise KeyError("choices")

    publisher = await Publisher.open(amqp)
    running = TaskPerDelivery(handle, publisher, topology)
    subscription = Subscription(channel, queue, running)
    await subscription.start()
    for message_id in ("fine", "poison", "flaky", "buggy"):
        await publisher.publish("", queue, b"{}", message_id=message_id)
    # a message handed back may come again before one published after it
    await wait_for(lambda: len(seen) >= 5)
    await running.drain(5)
    assert sorted(seen) == [("buggy", False), ("fine", False), ("flaky", False),
                            ("flaky", True), ("poison", False)]
    dead = await channel.get_queue(topology.dead_letter_queue, ensure=False)
    reasons = {}
    for _ in range(100):
        message = await dead.get(no_ack=False, fail=False)
        if message is None:
            break
        if message.message_id in ("poison", "buggy"):
            reasons[message.message_id] = (message.headers or {}).get(REASON_HEADER)
            await message.ack()
        else:
            await message.nack(requeue=True)
    assert reasons == {"poison": "poison: cannot be read",
                       "buggy": "the handler raised KeyError: 'choices'"}
    await subscription.cancel()
    # Nothing is left unsettled: the queue is empty once the consumer is gone.
    declared = await channel.declare_queue(queue, passive=True)
    assert declared.declaration_result.message_count == 0
    await publisher.channel.close()
