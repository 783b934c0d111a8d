"""The one way casetrail consumes a queue.

A :class:`Subscription` registers a consumer on the aiormq channel under a robust
aio-pika channel (aio-pika's per-message wrapper objects cost more CPU than the
work they carry at thousands of messages a second); when the robust connection
comes back after a broker restart it reopens the channel, prefetch included, and
the consumer is registered again. Each message reaches ``on_delivery`` as a
:class:`Delivery`, from a task of aiormq's (the public path) or in line from the
channel's reader (``casetrail.adapters.bus.fastpath``, when the component switched it on).

How a message is settled is steered by what its handler raises, never by the
handler touching the channel (:func:`settled`):

- it returns: ack;
- ``Reject(reason)``: the message goes to the dead-letter exchange with the reason
  in its headers, then ack;
- a ``TransientError`` (or the task being cancelled on shutdown): nack with
  requeue, so the broker hands it out again;
- anything else (a bug): logged, then dead-lettered with the exception as its reason
  (code ``internal_error``) and acked: never left unsettled, holding its place.

The event-log consumer settles its batches itself (one ``multiple`` ack per batch,
after the commit), with the same dead-letter path for the messages it rejects.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiormq
from aio_pika.abc import AbstractChannel, AbstractRobustChannel
from aiormq.abc import AbstractChannel as RawChannel
from aiormq.abc import DeliveredMessage

from casetrail.adapters.bus import fastpath
from casetrail.adapters.bus.dead_letter import dead_letter
from casetrail.adapters.bus.publisher import Publisher
from casetrail.adapters.bus.topology import Topology
from casetrail.contract.dead_letters import DeadLetterCode
from casetrail.errors import BusUnavailable, Reject, TransientError, scrub

log = logging.getLogger("casetrail.bus")

_CLOSED = (aiormq.exceptions.AMQPError, RuntimeError)
"""What settling on a channel that has since closed raises."""


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
    def redelivered(self) -> bool:
        """The broker handed this message out before (to a consumer that did not settle
        it: one that stopped, or died, while holding it)."""
        return bool(self.raw.redelivered)

    @property
    def type(self) -> str | None:
        return self.raw.header.properties.message_type

    @property
    def correlation_id(self) -> str | None:
        return self.raw.header.properties.correlation_id

    @property
    def reply_to(self) -> str | None:
        return self.raw.header.properties.reply_to

    @property
    def user_id(self) -> str | None:
        return self.raw.header.properties.user_id

    @property
    def headers(self) -> dict[str, Any]:
        return self.raw.header.properties.headers or {}

    @property
    def routing_key(self) -> str | None:
        return self.raw.routing_key

    @property
    def exchange(self) -> str | None:
        return self.raw.exchange

    async def ack(self, *, multiple: bool = False) -> None:
        """Raises ``BusUnavailable`` if the channel it came on has closed: the broker
        then redelivers it."""
        try:
            await self.channel.basic_ack(self.delivery_tag, multiple=multiple)
        except _CLOSED as exc:
            raise BusUnavailable(f"cannot ack on a closed channel: {exc!r}") from exc

    async def nack(self, *, requeue: bool) -> None:
        try:
            await self.channel.basic_nack(self.delivery_tag, requeue=requeue)
        except _CLOSED as exc:
            raise BusUnavailable(f"cannot nack on a closed channel: {exc!r}") from exc


def _wrap(channel: RawChannel, message: DeliveredMessage) -> Delivery:
    return Delivery(channel, message)


@dataclass
class Subscription:
    """A consumer on ``queue`` that survives reconnects (on a robust channel);
    ``on_delivery`` must not block.

    With ``no_ack`` the broker counts a message delivered as settled (tool replies)."""

    channel: AbstractChannel
    queue: str
    on_delivery: Callable[[Delivery], None]
    no_ack: bool = False
    fast: bool = field(default_factory=fastpath.enabled)
    """Deliveries in line from the channel's reader (``fastpath.deliver_in_line``)."""
    _consuming: dict[str, RawChannel] = field(default_factory=dict)

    async def start(self) -> None:
        if isinstance(self.channel, AbstractRobustChannel):
            self.channel.reopen_callbacks.add(self._subscribe)
        await self._subscribe()

    async def _subscribe(self, *_: object) -> None:
        raw = await self.channel.get_underlay_channel()
        on_delivery = self.on_delivery

        async def deliver(message: DeliveredMessage) -> None:
            try:
                on_delivery(Delivery(raw, message))
            except Exception:  # log, keep consuming: one bad message must not stop the rest
                log.exception("delivery handler failed on %s", self.queue)

        # The tag is chosen here so that an in-line delivery is in place before the
        # broker's first delivery, which can reach the channel before consume-ok does.
        # (basic_consume still needs its callback; the in-line path stands in for it.)
        tag = f"casetrail-{uuid.uuid4().hex}"
        if self.fast:
            fastpath.deliver_in_line(raw, tag, on_delivery, _wrap)
        await raw.basic_consume(self.queue, deliver, consumer_tag=tag, no_ack=self.no_ack)
        self._consuming.clear()
        self._consuming[tag] = raw

    async def cancel(self) -> None:
        """Stop deliveries; unsettled ones return to the queue when the channel closes."""
        if isinstance(self.channel, AbstractRobustChannel):
            self.channel.reopen_callbacks.discard(self._subscribe)
        for tag, raw in self._consuming.items():
            with contextlib.suppress(*_CLOSED):
                await raw.basic_cancel(tag)
        self._consuming.clear()


async def settle(delivery: Delivery, outcome: Awaitable[None], *,
                 dead_letters: Publisher, topology: Topology) -> None:
    """Await ``outcome`` (the handling of ``delivery``) and settle the delivery by how
    it ended (see the module). A channel closed meanwhile leaves it unsettled: the
    broker redelivers it, and every handler here is idempotent."""
    try:
        try:
            await outcome
        except Reject as exc:
            await dead_letter(dead_letters, topology, delivery, exc.reason, exc.code)
            await delivery.ack()
        except TransientError as exc:
            log.info("message %s handed back (%s)", delivery.message_id, exc)
            await delivery.nack(requeue=True)
        except asyncio.CancelledError:
            with contextlib.suppress(BusUnavailable):
                await delivery.nack(requeue=True)
            raise
        except Exception as exc:  # a bug: set aside with the reason, never left unsettled
            log.exception("handling message %s raised", delivery.message_id)
            await dead_letter(dead_letters, topology, delivery,
                              scrub(f"the handler raised {type(exc).__name__}: {exc}"),
                              DeadLetterCode.INTERNAL_ERROR)
            await delivery.ack()
        else:
            await delivery.ack()
    except BusUnavailable as exc:
        log.info("settling %s skipped (%s); the broker redelivers it", delivery.message_id, exc)


@dataclass
class TaskPerDelivery:
    """Runs ``handle`` for each delivery in a task of its own (a case outlives the
    channel it came on) and settles it with :func:`settle`; ``drain`` waits for them."""

    handle: Callable[[Delivery], Awaitable[None]]
    dead_letters: Publisher
    topology: Topology
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def __call__(self, delivery: Delivery) -> None:
        task = asyncio.create_task(settle(delivery, self.handle(delivery),
                                          dead_letters=self.dead_letters,
                                          topology=self.topology))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def drain(self, timeout: float) -> None:
        """Wait up to ``timeout`` for the tasks in flight, then cancel the rest (each
        hands its message back)."""
        if self.tasks:
            await asyncio.wait(self.tasks, timeout=timeout)
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
