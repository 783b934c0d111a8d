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
from dataclasses import dataclass
from typing import Any

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel, AbstractRobustConnection
from pamqp.commands import Basic
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_delay,
    wait_exponential_jitter,
)

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


async def connect(url: str, name: str) -> AbstractRobustConnection:
    """A robust connection: it reconnects and restores channels, queues and consumers."""
    try:
        return await aio_pika.connect_robust(url, client_properties={"connection_name": name})
    except (OSError, aiormq.exceptions.AMQPError) as exc:
        where = url.rsplit("@", maxsplit=1)[-1]
        raise BusUnavailable(f"cannot reach RabbitMQ at {where}: {exc}") from exc


@dataclass
class Publisher:
    """Publishes bytes with confirms on its own channel."""

    channel: AbstractChannel
    retry_seconds: float = PUBLISH_RETRY_SECONDS

    @classmethod
    async def open(cls, connection: AbstractRobustConnection, **kwargs: Any) -> Publisher:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        return cls(channel, **kwargs)

    async def _send(
        self, exchange: str, routing_key: str, body: bytes, properties: Basic.Properties
    ) -> None:
        # Straight to the channel under aio-pika's robust wrapper (which restores it
        # after a reconnect): the per-message wrapper objects cost more CPU than the
        # publish itself on the hot path. The channel was opened with publisher
        # confirms and on_return_raises, so this returns on the broker's ack and
        # raises on a nack or a return.
        if self.channel.is_closed:
            raise aiormq.exceptions.ChannelInvalidStateError("publisher channel is closed")
        channel = await self.channel.get_underlay_channel()
        await channel.basic_publish(
            body, exchange=exchange, routing_key=routing_key, properties=properties,
            mandatory=True,
        )

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
        properties = Basic.Properties(
            content_type="application/json",
            delivery_mode=2 if persistent else 1,  # 2 = persistent: survives a restart
            message_id=message_id,
            message_type=message_type,
            correlation_id=correlation_id,
            reply_to=reply_to,
            headers=headers,
            expiration=None if expiration_seconds is None
            else str(max(1, round(expiration_seconds * 1000))),
        )
        try:
            try:
                # The common case, without the retry machinery's per-call cost.
                await self._send(exchange, routing_key, body, properties)
                return
            except _CONNECTION_ERRORS as exc:
                log.warning("publish to %r failed (%r); retrying", exchange, exc)
            async for attempt in AsyncRetrying(
                retry=retry_if_exception_type(_CONNECTION_ERRORS),
                wait=wait_exponential_jitter(multiplier=0.1, max=3.0),
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
