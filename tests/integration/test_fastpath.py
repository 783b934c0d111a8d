"""The AMQP fast path against the real broker: switched on only by a component, checked
against the library versions it was written for, and, when on, really taken (these
tests fail if a publisher or subscription silently falls back to the public path)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import aio_pika
import aiormq
import pytest
from aiormq.abc import ChannelFrame
from pamqp.heartbeat import Heartbeat

from casetrail.adapters.bus import fastpath
from casetrail.adapters.bus.deliveries import Delivery, Subscription
from casetrail.adapters.bus.properties import Properties
from casetrail.adapters.bus.publisher import Publisher
from tests.support.helpers import drain, wait_until


@pytest.fixture
def restore_switch() -> Iterator[None]:
    was = fastpath.enabled()
    yield
    if was:
        assert fastpath.enable(True)
    else:
        fastpath.disable()


def test_the_installed_libraries_are_the_ones_the_fast_path_was_written_for() -> None:
    """If this fails after an upgrade, the components log a warning and run the public
    path: check fastpath.py against the new aiormq and pamqp, then widen WRITTEN_FOR."""
    assert fastpath.unsupported(fastpath.installed_versions()) == []


def test_other_versions_get_one_warning_and_the_public_path(
    caplog: pytest.LogCaptureFixture, restore_switch: None
) -> None:
    with caplog.at_level(logging.WARNING, logger="casetrail.bus"):
        assert not fastpath.enable(True, versions={"aiormq": "7.3.0", "pamqp": "4.0.1"})
    assert not fastpath.enabled()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "aiormq 7.3.0 (written for 7.2.x)" in warnings[0].getMessage()
    assert fastpath.enable(True, versions={"aiormq": "7.2.9", "pamqp": "3.3.0"})
    assert not fastpath.enable(False)
    assert not fastpath.enabled()


def test_importing_the_bus_switches_nothing_on() -> None:
    """A process that only imports casetrail's bus modules keeps aiormq as it is."""
    import subprocess
    import sys

    code = ("import casetrail.adapters.bus.publisher, casetrail.adapters.bus.deliveries, "
            "casetrail.adapters.bus.fastpath as f, aiormq.connection as c; "
            "print(f.enabled(), c.FrameReceiver.__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["False", "aiormq.connection"]


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "public"])
async def test_a_publisher_takes_the_path_it_was_opened_with(
    amqp: aio_pika.abc.AbstractRobustConnection, queue: aio_pika.abc.AbstractQueue,
    monkeypatch: pytest.MonkeyPatch, fast: bool,
) -> None:
    public_calls = 0
    public = aiormq.Channel.basic_publish

    async def counted(self: aiormq.Channel, *args: Any, **kwargs: Any) -> Any:
        nonlocal public_calls
        public_calls += 1
        return await public(self, *args, **kwargs)

    monkeypatch.setattr(aiormq.Channel, "basic_publish", counted)
    publisher = await Publisher.open(amqp)
    publisher.fast = fast
    await asyncio.gather(*(publisher.publish("", queue.name, str(i).encode(),
                                             message_id=f"p-{i}") for i in range(30)))
    arrived = await drain(queue, 30)
    assert sorted(int(m.body) for m in arrived) == list(range(30))
    assert public_calls == (0 if fast else 30)
    await publisher.channel.close()


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "public"])
async def test_in_line_deliveries_run_in_the_channel_reader_not_a_task_each(
    amqp: aio_pika.abc.AbstractRobustConnection, queue: aio_pika.abc.AbstractQueue,
    fast: bool,
) -> None:
    channel = await amqp.channel()
    assert isinstance(channel, aio_pika.abc.AbstractRobustChannel)
    tasks: list[asyncio.Task[Any] | None] = []
    got: list[Delivery] = []

    def handle(delivery: Delivery) -> None:
        tasks.append(asyncio.current_task())
        got.append(delivery)

    subscription = Subscription(channel, queue.name, handle, fast=fast)
    await subscription.start()
    publisher = await Publisher.open(amqp)
    await asyncio.gather(*(publisher.publish("", queue.name, b"{}", message_id=f"d-{i}")
                           for i in range(20)))

    async def all_arrived() -> bool:
        return len(got) == 20

    await wait_until(all_arrived, timeout=10, interval=0.01)
    distinct = len({id(t) for t in tasks})
    assert distinct == (1 if fast else 20)
    await got[-1].ack(multiple=True)
    await subscription.cancel()
    await publisher.channel.close()
    await channel.close()


async def test_publishes_keep_their_order_when_the_connection_write_queue_is_full(
    amqp: aio_pika.abc.AbstractRobustConnection, queue: aio_pika.abc.AbstractQueue
) -> None:
    channel = await amqp.channel(publisher_confirms=True, on_return_raises=True)
    confirmed = fastpath.ConfirmedChannel(await channel.get_underlay_channel())
    first = [confirmed.publish("", queue.name, str(i).encode(), Properties(message_id=f"q-{i}"))
             for i in range(25)]
    # The buffer is handed over at the end of this turn; by then the connection's
    # bounded write queue is full (of heartbeats, harmless to the broker), so the
    # hand-over has to wait for room while later publishes pile up behind it.
    heartbeat = ChannelFrame.marshall(0, [Heartbeat()])
    while not confirmed.channel.write_queue.full():
        confirmed.channel.write_queue.put_nowait(heartbeat)
    await asyncio.sleep(0)
    later = [confirmed.publish("", queue.name, str(i).encode(), Properties(message_id=f"q-{i}"))
             for i in range(25, 50)]
    async with asyncio.timeout(10):
        await asyncio.gather(*first, *later)
    arrived = await drain(queue, 50)
    assert [m.body for m in arrived] == [str(i).encode() for i in range(50)]
    await channel.close()
