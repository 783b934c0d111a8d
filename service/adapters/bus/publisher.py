"""The one place that publishes to RabbitMQ.

Every message is bytes (anything else fails at the call, loudly), persistent,
``mandatory`` on a channel with publisher confirms and ``on_return_raises``, so
``publish`` returns only once the broker has taken responsibility for the
message, and raises if it did not. A publish that fails because the
connection dropped is retried with backoff (tenacity); a re-publish may
duplicate a message, which the event ids make harmless. So is a publish the broker *nacked*:
a nack says the broker could not take the message just now (a quorum queue between
leaders while a node is lost), not that it never will, so it is published again
within the same time (``retry_nacks``); a returned message (unroutable) is not.

A publish goes out through aiormq's public ``basic_publish``, or, when the
component switched the fast path on (``casetrail.adapters.bus.fastpath``), through its
``ConfirmedChannel``; the choice is made when the publisher is opened.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import aiormq
from aio_pika.abc import AbstractChannel, AbstractRobustConnection
from pamqp.commands import Basic
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    retry_if_not_exception_type,
    stop_after_delay,
    wait_exponential_jitter,
)

from casetrail.adapters.bus import fastpath
from casetrail.adapters.bus.properties import Properties
from casetrail.adapters.bus.topology import Topology
from casetrail.contract.events import MAX_EVENT_BYTES, Event
from casetrail.contract.integrity import HEADER as INTEGRITY_HEADER
from casetrail.contract.integrity import Integrity, Signer
from casetrail.engine.backoff import backoff_delay
from casetrail.errors import BusUnavailable, PublishRejected
from casetrail.telemetry import metrics, tracing
from casetrail.trail.emitter import TrailEmitter

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


class _Nacked(Exception):
    """The broker nacked a publish (``Basic.Nack``): it did not take the message."""


def _nacked(exc: BaseException) -> bool:
    return isinstance(exc, aiormq.exceptions.DeliveryError) \
        and isinstance(exc.frame, Basic.Nack)


@dataclass
class Publisher:
    """Publishes bytes with confirms on its own channel."""

    channel: AbstractChannel
    retry_seconds: float = PUBLISH_RETRY_SECONDS
    user_id: str | None = None
    """The connection's broker user, set on every message (the broker checks it)."""
    retry_nacks: bool = True
    """Publish a nacked message again (within ``retry_seconds``). Off where a nack
    should be answered at once (the API's start commands: a full start queue is a 503
    the client retries, not a request held open)."""
    fast: bool = field(default_factory=fastpath.enabled)
    """Publish through ``fastpath.ConfirmedChannel`` (else aiormq's ``basic_publish``)."""
    _confirmed: fastpath.ConfirmedChannel | None = field(default=None, init=False, repr=False)

    @classmethod
    async def open(cls, connection: AbstractRobustConnection, **kwargs: Any) -> Publisher:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        url = getattr(connection, "url", None)  # aio-pika's connections carry theirs
        kwargs.setdefault("user_id", url.user if url is not None else None)
        return cls(channel, **kwargs)

    async def _send(
        self, exchange: str, routing_key: str, body: bytes, properties: Properties
    ) -> None:
        # Straight to the aiormq channel under aio-pika's robust wrapper, which
        # reopens it after a reconnect (and a reopened channel gets a new
        # ConfirmedChannel, with delivery tags counted from one again). aio-pika's
        # Exchange.publish would add a Message object and a lookup per publish.
        if self.channel.is_closed:
            raise aiormq.exceptions.ChannelInvalidStateError("publisher channel is closed")
        channel = await self.channel.get_underlay_channel()
        if not self.fast:
            await channel.basic_publish(body, exchange=exchange, routing_key=routing_key,
                                        properties=properties.to_basic(), mandatory=True)
            return
        confirmed = self._confirmed
        if confirmed is None or confirmed.channel is not channel:
            confirmed = self._confirmed = fastpath.ConfirmedChannel(channel)
        await confirmed.publish(exchange, routing_key, body, properties)

    async def _send_once(
        self, exchange: str, routing_key: str, body: bytes, properties: Properties
    ) -> None:
        """``_send``, with a nack to be retried told apart (``_Nacked``)."""
        try:
            await self._send(exchange, routing_key, body, properties)
        except aiormq.exceptions.DeliveryError as exc:
            if self.retry_nacks and _nacked(exc):
                raise _Nacked(str(exc)) from exc
            raise

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
        broker returns the message (unroutable) or nacks it (at once, or still after
        ``retry_seconds`` with ``retry_nacks``), ``BusUnavailable`` when it cannot be
        reached for ``retry_seconds``.
        """
        if not isinstance(body, bytes):
            raise TypeError(
                f"the bus carries bytes, not {type(body).__name__}: serialize it first"
            )
        if tracing.ENABLED:  # the trace goes on with the message (a no-op outside a span)
            headers = dict(headers or {})
            tracing.inject(headers)
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
            user_id=self.user_id,
        )
        try:
            try:
                # The common case, without the retry machinery's per-call cost.
                sent = time.perf_counter()
                await self._send_once(exchange, routing_key, body, properties)
                metrics.publish_confirm(exchange).observe(time.perf_counter() - sent)
                return
            except aiormq.exceptions.ChannelAccessRefused:
                raise  # this identity may not publish there: no retry makes it allowed
            except (*_CONNECTION_ERRORS, _Nacked) as exc:
                # Wait as before any retry: the connection (or the queue's leader) is
                # likely still coming back.
                delay = backoff_delay(_RETRY_WAIT, 1)
                log.warning("publish to %r failed (%r); retrying in %.2fs", exchange, exc, delay)
                await asyncio.sleep(delay)
            async for attempt in AsyncRetrying(
                retry=retry_if_exception_type((*_CONNECTION_ERRORS, _Nacked))
                & retry_if_not_exception_type(aiormq.exceptions.ChannelAccessRefused),
                wait=_RETRY_WAIT,
                stop=stop_after_delay(self.retry_seconds),
                reraise=True,
            ):
                with attempt:
                    await self._send_once(exchange, routing_key, body, properties)
        except aiormq.exceptions.ChannelAccessRefused as exc:
            raise PublishRejected(f"broker user {self.user_id!r} may not publish to "
                                  f"{exchange!r}/{routing_key!r}: {exc}") from exc
        except (aiormq.exceptions.DeliveryError, _Nacked) as exc:
            raise PublishRejected(
                f"broker refused message for {exchange!r}/{routing_key!r}: "
                f"{exc.__cause__ or exc}"
            ) from exc
        except _CONNECTION_ERRORS as exc:
            raise BusUnavailable(f"publish to {exchange!r} failed: {exc!r}") from exc


@dataclass
class EventPublisher:
    """Events on RabbitMQ, once the trail has signed them (``casetrail.trail.emitter``):
    one message per event, its canonical bytes as the body and its integrity in the
    ``x-casetrail-integrity`` header, routed by the event's type."""

    publisher: Publisher
    topology: Topology

    async def publish_sealed(self, event: Event, body: bytes, integrity: Integrity) -> None:
        await self.publisher.publish(
            self.topology.events_exchange,
            event.routing_key,
            body,
            message_id=str(event.event_id),
            message_type=event.event_type,
            correlation_id=str(event.case_id),
            headers={INTEGRITY_HEADER: integrity.as_json()},
        )


def event_emitter(publisher: Publisher, topology: Topology, signer: Signer,
                  max_event_bytes: int = MAX_EVENT_BYTES) -> TrailEmitter:
    """The engine's ``EventSink`` on RabbitMQ: the trail's emitter over an
    ``EventPublisher``."""
    return TrailEmitter(EventPublisher(publisher, topology), signer, max_event_bytes)
