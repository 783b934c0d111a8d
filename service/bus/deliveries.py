"""Consuming a queue below aio-pika's message objects, with its reconnects kept.

At thousands of messages a second, aio-pika's per-message wrapper objects cost
more CPU than the work they carry. Here a consumer is registered on the aiormq
channel under a robust channel; when the robust connection comes back after a
broker restart it reopens the channel (prefetch included) and the consumer is
registered again.

aiormq hands each delivery to its consumer in a new task. The callback here only
puts the message where the consumer's own loop takes it, so it is called in line
instead, from the channel's reader (see ``_deliver_in_line``).
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import aiormq
from aio_pika.abc import AbstractRobustChannel
from aiormq.abc import AbstractChannel as RawChannel
from aiormq.abc import DeliveredMessage
from pamqp.commands import Basic
from pamqp.header import ContentHeader

log = logging.getLogger("casetrail.bus")


@dataclass(frozen=True, slots=True)
class Delivery:
    """One message as consumers need it, with the channel it came on (to settle it)."""

    channel: RawChannel
    raw: DeliveredMessage

    @property
    def body(self) -> bytes:
        return self.raw.body

    @property
    def delivery_tag(self) -> int:
        return self.raw.delivery_tag or 0

    @property
    def message_id(self) -> str | None:
        return self.raw.header.properties.message_id

    @property
    def type(self) -> str | None:
        return self.raw.header.properties.message_type

    @property
    def correlation_id(self) -> str | None:
        return self.raw.header.properties.correlation_id

    @property
    def routing_key(self) -> str | None:
        return self.raw.routing_key

    @property
    def exchange(self) -> str | None:
        return self.raw.exchange

    async def ack(self, *, multiple: bool = False) -> None:
        """Raises if the channel it came on has closed: the broker redelivers it."""
        await self.channel.basic_ack(self.delivery_tag, multiple=multiple)

    async def nack(self, *, requeue: bool) -> None:
        await self.channel.basic_nack(self.delivery_tag, requeue=requeue)


@dataclass
class Subscription:
    """A consumer on ``queue`` that survives reconnects; ``on_delivery`` must not block."""

    channel: AbstractRobustChannel
    queue: str
    on_delivery: Callable[[Delivery], None]
    _consuming: dict[str, RawChannel] = field(default_factory=dict)

    async def start(self) -> None:
        self.channel.reopen_callbacks.add(self._subscribe)
        await self._subscribe()

    async def _subscribe(self, *_: object) -> None:
        raw = await self.channel.get_underlay_channel()
        on_delivery = self.on_delivery

        # basic_consume needs a callback of aiormq's kind; deliveries to this tag take
        # the in-line path below, so this one only stands in for it.
        async def deliver(message: DeliveredMessage) -> None:
            on_delivery(Delivery(raw, message))

        # The tag is chosen here so that the in-line delivery is in place before the
        # broker's first delivery, which can reach the channel before consume-ok does.
        tag = f"casetrail-{uuid.uuid4().hex}"
        _deliver_in_line(raw, tag, on_delivery)
        await raw.basic_consume(self.queue, deliver, consumer_tag=tag)
        self._consuming.clear()
        self._consuming[tag] = raw

    async def cancel(self) -> None:
        """Stop deliveries; unsettled ones return to the queue when the channel closes."""
        self.channel.reopen_callbacks.discard(self._subscribe)
        for tag, raw in self._consuming.items():
            with contextlib.suppress(aiormq.exceptions.AMQPError, RuntimeError):
                await raw.basic_cancel(tag)
        self._consuming.clear()


def _deliver_in_line(raw: RawChannel, tag: str, on_delivery: Callable[[Delivery], None]
                     ) -> None:
    """Deliveries to ``tag`` on ``raw`` reach ``on_delivery`` from the channel's reader.

    This replaces aiormq's ``_on_deliver_frame`` on this channel (its reader calls it
    by that name) with one that reads the content as aiormq does and then calls
    ``on_delivery`` directly, where aiormq would start a task for each message.
    Deliveries to any other consumer on the channel go the usual way.
    """
    if not isinstance(raw, aiormq.Channel):
        raise TypeError(f"needs an aiormq channel, not {type(raw).__name__}")
    channel = raw
    usual = channel._on_deliver_frame

    async def on_deliver_frame(frame: Basic.Deliver) -> None:
        if frame.consumer_tag != tag:
            await usual(frame)
            return
        header = await channel._get_frame()
        if not isinstance(header, ContentHeader):
            raise ValueError(f"Unexpected frame {header!r} instead of ContentHeader")
        message = await channel._read_content(frame, header)
        try:
            on_delivery(Delivery(channel, message))
        except Exception:  # as aiormq does for a failing consumer: log, keep reading
            log.exception("delivery handler failed on %s", tag)

    setattr(channel, "_on_deliver_frame", on_deliver_frame)  # noqa: B010
