"""The one place that publishes to RabbitMQ.

Every message is bytes (anything else fails at the call, loudly), persistent,
``mandatory`` on a channel with publisher confirms and ``on_return_raises``, so
``publish`` returns only once the broker has taken responsibility for the
message, and raises if it did not. A publish that fails because the
connection dropped is retried with backoff (tenacity); a re-publish may
duplicate a message, which the event ids make harmless.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel, AbstractRobustConnection
from aiormq.abc import AbstractChannel as RawChannel
from aiormq.abc import ChannelFrame, TaskType
from aiormq.channel import Returning
from pamqp.commands import Basic
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_delay,
    wait_exponential_jitter,
)

from service.backoff import backoff_delay
from service.bus.frames import Properties, publish_frames
from service.bus.topology import Topology
from service.errors import BusUnavailable, PublishRejected
from service.events import Event

log = logging.getLogger("casetrail.bus")

PUBLISH_RETRY_SECONDS = 60.0
"""How long a publish keeps retrying through a broker outage before it gives up."""

_CONNECTION_ERRORS = (
    aiormq.exceptions.AMQPConnectionError,
    aiormq.exceptions.ChannelInvalidStateError,
    aiormq.exceptions.ChannelClosed,
    ConnectionError,
    asyncio.TimeoutError,
)
_RETRY_WAIT = wait_exponential_jitter(multiplier=0.1, max=3.0)


async def connect(url: str, name: str) -> AbstractRobustConnection:
    """A robust connection: it reconnects and restores channels, queues and consumers."""
    try:
        return await aio_pika.connect_robust(url, client_properties={"connection_name": name})
    except (OSError, aiormq.exceptions.AMQPError) as exc:
        where = url.rsplit("@", maxsplit=1)[-1]
        raise BusUnavailable(f"cannot reach RabbitMQ at {where}: {exc}") from exc


class ConfirmedChannel:
    """Confirmed publishes on one aiormq channel, below ``basic_publish``.

    ``basic_publish`` holds the channel's lock until the connection's writer task
    has written and drained its frames, so concurrent publishes queue behind one
    another at several task switches each. Here a publish encodes its frames
    (``service.bus.frames``) and registers its confirm in the channel's own books
    as ``basic_publish`` does: the delivery tag, the confirmation future that the
    channel's reader resolves on the broker's ack or nack (or fails on a return),
    and the message id that its return handling looks up. The futures are plain
    ones, failed here when the channel closes (``_fail_unconfirmed``). The
    frames go to a buffer that reaches the connection's writer once per event-loop
    turn, in delivery-tag order, so the publishes of one turn leave in one write.

    Nothing else may publish on the channel: the broker numbers publishes in the
    order it receives them, and the tags here count on that.

    The broker's acks and nacks are settled by ``_on_confirm_frame`` below, which
    replaces aiormq's handler on this channel (the channel's reader calls it by
    that name). aiormq's walks every unconfirmed publish for each ``multiple``
    ack, and schedules a callback for each one it settles: with 2,000 cases in
    flight that was 40 % of the worker's CPU. ``_on_close_frame`` is wrapped too, so
    that nothing is sent once the broker has closed the channel.
    """

    def __init__(self, channel: RawChannel) -> None:
        if not isinstance(channel, aiormq.Channel):
            raise TypeError(f"needs an aiormq channel, not {type(channel).__name__}")
        self.channel: aiormq.Channel = channel
        self._buffer: list[bytes] = []
        self._flush_scheduled = False
        self._slow_put: TaskType | None = None
        self._closed_by_broker = False
        self._message_ids: dict[int, str] = {}
        """Each unconfirmed publish's message id by tag, to clear its entry in the
        channel's return lookup once the broker has settled it."""
        setattr(channel, "_on_confirm_frame", self._on_confirm_frame)  # noqa: B010
        on_close_frame = channel._on_close_frame

        async def closed_by_broker(frame: Any) -> None:
            # From here on the channel's number is the broker's again (aiormq answers
            # Close-Ok at once, before the channel counts as closed): a frame sent on
            # it now would be a connection error, so nothing more leaves.
            self._closed_by_broker = True
            self._buffer.clear()
            await on_close_frame(frame)

        setattr(channel, "_on_close_frame", closed_by_broker)  # noqa: B010
        channel.closing.add_done_callback(self._fail_unconfirmed)

    def _fail_unconfirmed(self, closing: asyncio.Future[Any]) -> None:
        """The channel has closed: every publish still waiting fails with the reason.

        The confirmations are plain futures, not entries in aiormq's future store,
        which would fail them itself but adds three done-callbacks to each (two
        stores, the channel's and its connection's, plus one to read the exception):
        a third of a confirmed publish's client CPU."""
        reason: BaseException = aiormq.exceptions.ChannelInvalidStateError(
            "publisher channel closed")
        if not closing.cancelled() and closing.exception() is not None:
            reason = closing.exception()  # type: ignore[assignment]
        for confirmation in self.channel.confirmations.values():
            if isinstance(confirmation, asyncio.Future) and not confirmation.done():
                confirmation.set_exception(reason)
                confirmation.exception()  # retrieved: no warning if nobody waits any more
        self._message_ids.clear()

    @property
    def is_closed(self) -> bool:
        return self._closed_by_broker or self.channel.is_closed

    async def _on_confirm_frame(self, frame: Basic.Ack | Basic.Nack) -> None:
        """Settle the publishes an ack or nack covers. Confirmations are entered in
        tag order, so a ``multiple`` one takes them from the front and stops at the
        first later tag. (A return re-enters its tag at the back, as an already
        settled ``Returning`` marker; a later ack clears it.)"""
        confirmations = self.channel.confirmations
        returns, message_ids = self.channel.message_id_delivery_tag, self._message_ids
        last = frame.delivery_tag
        if frame.multiple:
            tags = []
            for tag in confirmations:
                if tag > last:
                    break
                tags.append(tag)
        else:
            tags = [last]
        for tag in tags:
            message_id = message_ids.pop(tag, None)
            if message_id is not None and returns.get(message_id) == tag:
                del returns[message_id]
            confirmation = confirmations.pop(tag, None)
            if confirmation is None or isinstance(confirmation, Returning) \
                    or confirmation.done():  # returned, or its publisher stopped waiting
                continue
            if isinstance(frame, Basic.Ack):
                confirmation.set_result(frame)
            else:
                confirmation.set_exception(aiormq.exceptions.DeliveryError(None, frame))
                confirmation.exception()

    def publish(
        self, exchange: str, routing_key: str, body: bytes, properties: Properties
    ) -> asyncio.Future[Any]:
        """Queue one publish; the future resolves on the broker's ack and fails on a
        nack, a return (unroutable) or the channel closing."""
        channel = self.channel
        if self.is_closed:
            raise aiormq.exceptions.ChannelInvalidStateError("publisher channel is closed")
        frames = publish_frames(channel.number, exchange, routing_key, body, properties,
                                max_body_frame=channel.max_content_size)
        channel.delivery_tag += 1
        tag = channel.delivery_tag
        confirmation = channel.loop.create_future()
        channel.confirmations[tag] = confirmation
        channel.message_id_delivery_tag[properties.message_id] = tag
        self._message_ids[tag] = properties.message_id
        self._buffer.append(frames)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            channel.loop.call_soon(self._flush)
        return confirmation

    def _take(self) -> ChannelFrame:
        frame = ChannelFrame(payload=b"".join(self._buffer), should_close=False)
        self._buffer.clear()
        return frame

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._slow_put is not None or not self._buffer:
            return  # a put waiting for room takes the buffer along when it is done
        if self.is_closed:
            self._buffer.clear()  # their confirmations failed with the channel
            return
        frame = self._take()
        try:
            self.channel.write_queue.put_nowait(frame)
        except asyncio.QueueFull:
            self._slow_put = self.channel.create_task(self._put_waiting(frame))

    async def _put_waiting(self, frame: ChannelFrame) -> None:
        """The connection's write queue is full: wait for room, keeping the order."""
        try:
            while True:
                await self.channel.write_queue.put(frame)
                if not self._buffer or self.is_closed:
                    return
                frame = self._take()
        finally:
            self._slow_put = None
            if self.is_closed:
                self._buffer.clear()


@dataclass
class Publisher:
    """Publishes bytes with confirms on its own channel."""

    channel: AbstractChannel
    retry_seconds: float = PUBLISH_RETRY_SECONDS
    _confirmed: ConfirmedChannel | None = field(default=None, init=False, repr=False)

    @classmethod
    async def open(cls, connection: AbstractRobustConnection, **kwargs: Any) -> Publisher:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        return cls(channel, **kwargs)

    async def _send(
        self, exchange: str, routing_key: str, body: bytes, properties: Properties
    ) -> None:
        # Straight to the aiormq channel under aio-pika's robust wrapper, which
        # reopens it after a reconnect; a reopened channel gets a new
        # ConfirmedChannel, with delivery tags counted from one again.
        if self.channel.is_closed:
            raise aiormq.exceptions.ChannelInvalidStateError("publisher channel is closed")
        channel = await self.channel.get_underlay_channel()
        confirmed = self._confirmed
        if confirmed is None or confirmed.channel is not channel:
            confirmed = self._confirmed = ConfirmedChannel(channel)
        await confirmed.publish(exchange, routing_key, body, properties)

    async def publish(
        self,
        exchange: str,
        routing_key: str,
        body: bytes,
        *,
        message_id: str | None = None,
        message_type: str | None = None,
        correlation_id: str | None = None,
        reply_to: str | None = None,
        headers: dict[str, Any] | None = None,
        expiration_seconds: float | None = None,
        persistent: bool = True,
    ) -> None:
        """Publish ``body`` and wait for the broker's confirm.

        Raises ``TypeError`` for anything but bytes, ``PublishRejected`` when the
        broker nacks or returns the message (unroutable), ``BusUnavailable`` when
        it cannot be reached for ``retry_seconds``.
        """
        if not isinstance(body, bytes):
            raise TypeError(
                f"the bus carries bytes, not {type(body).__name__}: serialize it first"
            )
        properties = Properties(
            # A message id is what the channel's return handling finds a publish by.
            message_id=message_id or uuid.uuid4().hex,
            persistent=persistent,  # delivery mode 2: survives a broker restart
            message_type=message_type,
            correlation_id=correlation_id,
            reply_to=reply_to,
            headers=headers,
            expiration_ms=None if expiration_seconds is None
            else max(1, round(expiration_seconds * 1000)),
        )
        try:
            try:
                # The common case, without the retry machinery's per-call cost.
                await self._send(exchange, routing_key, body, properties)
                return
            except _CONNECTION_ERRORS as exc:
                # Wait as before any retry: the connection is likely still coming back.
                delay = backoff_delay(_RETRY_WAIT, 1)
                log.warning("publish to %r failed (%r); retrying in %.2fs", exchange, exc, delay)
                await asyncio.sleep(delay)
            async for attempt in AsyncRetrying(
                retry=retry_if_exception_type(_CONNECTION_ERRORS),
                wait=_RETRY_WAIT,
                stop=stop_after_delay(self.retry_seconds),
                reraise=True,
            ):
                with attempt:
                    await self._send(exchange, routing_key, body, properties)
        except aiormq.exceptions.DeliveryError as exc:
            raise PublishRejected(
                f"broker refused message for {exchange!r}/{routing_key!r}: {exc}"
            ) from exc
        except _CONNECTION_ERRORS as exc:
            raise BusUnavailable(f"publish to {exchange!r} failed: {exc!r}") from exc


@dataclass
class EventPublisher:
    """The engine's ``EventSink`` on RabbitMQ: one message per event, as it happens."""

    publisher: Publisher
    topology: Topology

    async def emit(self, event: Event) -> None:
        await self.publisher.publish(
            self.topology.events_exchange,
            event.routing_key,
            event.to_json(),
            message_id=str(event.event_id),
            message_type=event.event_type,
            correlation_id=str(event.case_id),
        )
