"""Live events for the API's streams: one bus subscription per API process.

An API process holds one exclusive, auto-deleted queue on ``<ns>.events`` and one
consumer on it, however many streams are open. The queue is bound only to what
someone is watching, a binding per watched key (``case.*.<caseId>.#`` for a case's
stream, ``case.<tenantId>.#`` for a tenant's), counted: the first watcher of a key
binds it, the last one unbinds it. With no stream open the queue has no binding and
the process receives nothing, so streaming costs the event pipeline nothing until
someone looks.

The queue's bindings belong to its robust channel, so they come back with it after
a broker restart; what was published meanwhile is missing from the live feed, and a
case stream fills such a gap from the stored trail (``casetrail.api.streams``).

Only events the record would take are passed on: published by the worker's broker
identity (RabbitMQ sets ``user_id`` from the publishing connection), their hash and
signature verified under a registered, unretired key (``casetrail.trail.admission``, the
consumer's own checks), so a forged event that reaches the exchange (a dead letter
laundered back, say) is never shown. A watcher that falls more than
``WATCHER_BACKLOG`` events behind is cut off (its stream ends; a client resumes with
``Last-Event-ID``) rather than holding memory for a reader that does not read.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson
from aio_pika.abc import (
    AbstractChannel,
    AbstractExchange,
    AbstractQueue,
    AbstractRobustConnection,
)

from casetrail.adapters.bus.deliveries import Delivery, Subscription
from casetrail.adapters.bus.topology import Topology
from casetrail.contract.dead_letters import DeadLetterCode
from casetrail.contract.events import EVENT_TYPES
from casetrail.contract.integrity import HEADER, Integrity, IntegrityError
from casetrail.trail.admission import Admission, Refused

log = logging.getLogger("casetrail.api")

WATCHER_BACKLOG = 10_000
"""Events a watcher may have waiting before it is cut off."""

QUEUE_MAX_LENGTH = 100_000
"""The broker keeps at most this many for a stalled API process (oldest dropped)."""


@dataclass(frozen=True, slots=True)
class LiveEvent:
    """An event as it went by on the bus (not yet stored: ``recordedAt`` is null)."""

    case_id: str
    attempt: int
    seq: int
    event_type: str
    envelope: dict[str, Any]

    @property
    def key(self) -> tuple[int, int]:
        return self.attempt, self.seq


def case_key(case_id: uuid.UUID | str) -> str:
    return Topology.events_of(case_id=case_id)


def tenant_key(tenant: str) -> str:
    return Topology.events_of(tenant=tenant)


@dataclass(eq=False)
class Watcher:
    """One stream's view of the live feed."""

    events: asyncio.Queue[LiveEvent] = field(default_factory=asyncio.Queue)
    cut_off: bool = False
    """Fell too far behind: the stream must end."""

    def offer(self, event: LiveEvent) -> None:
        if self.cut_off:
            return
        # Past the backlog the event still goes in: it wakes the reader, who sees cut_off.
        self.cut_off = self.events.qsize() >= WATCHER_BACKLOG
        self.events.put_nowait(event)


_KNOWN_TYPES = frozenset(EVENT_TYPES)


def _live_event(message: Delivery) -> LiveEvent | None:
    try:
        envelope = orjson.loads(message.body)
        envelope["recordedAt"] = None
        try:
            envelope["integrity"] = Integrity.from_json(message.headers.get(HEADER)).as_json()
        except IntegrityError:
            envelope["integrity"] = None
        event_type, attempt, seq = envelope["eventType"], envelope["attempt"], envelope["seq"]
        # What a stream writes as its event's `event:` and `id:` lines: a known type and
        # whole numbers, never a string that could break a line of the stream.
        if event_type not in _KNOWN_TYPES or type(attempt) is not int or type(seq) is not int:
            raise TypeError(f"not an event of a known type at a whole position: "
                            f"{event_type!r} {attempt!r}.{seq!r}")
        uuid.UUID(envelope["eventId"])  # a tenant's stream writes it as the `id:` line
        return LiveEvent(envelope["caseId"], attempt, seq, event_type, envelope)
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
        log.warning("unreadable event %s not streamed: %s", message.message_id, exc)
        return None


@dataclass
class EventWatch:
    """The API process's subscription to ``<ns>.events``, shared by all its streams."""

    connection: AbstractRobustConnection
    topology: Topology
    admission: Admission
    """Only events it authenticates are passed on."""
    _watchers: dict[str, set[Watcher]] = field(default_factory=dict)
    _waiting_for_keys: set[asyncio.Task[None]] = field(default_factory=set)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _channel: AbstractChannel | None = None
    _queue: AbstractQueue | None = None
    _exchange: AbstractExchange | None = None
    _subscription: Subscription | None = None
    _unbinding: set[asyncio.Task[None]] = field(default_factory=set)

    async def open(self) -> None:
        await self.admission.keys.refresh(force=True)
        channel = await self.connection.channel()
        name = f"{self.topology.namespace}.watch.{uuid.uuid4().hex}"
        # Exclusive and auto-deleted: it lives as long as this process's connection.
        self._queue = await channel.declare_queue(
            name, exclusive=True, auto_delete=True,
            arguments={"x-max-length": QUEUE_MAX_LENGTH, "x-overflow": "drop-head"})
        self._exchange = await channel.get_exchange(self.topology.events_exchange,
                                                    ensure=False)
        self._subscription = Subscription(channel, name, self._deliver, no_ack=True)
        await self._subscription.start()
        self._channel = channel

    async def close(self) -> None:
        if self._unbinding:
            await asyncio.wait(self._unbinding, timeout=5)
        if self._subscription is not None:
            await self._subscription.cancel()
        if self._channel is not None and not self._channel.is_closed:
            await self._channel.close()

    @asynccontextmanager
    async def watch(self, key: str) -> AsyncIterator[Watcher]:
        """Live events matching ``key`` (``case_key`` or ``tenant_key``) from the moment
        this is entered: the binding is in place before it yields."""
        assert self._queue is not None and self._exchange is not None, "open() first"
        watcher = Watcher()
        async with self._lock:
            watchers = self._watchers.setdefault(key, set())
            watchers.add(watcher)
            if len(watchers) == 1:
                try:
                    await self._queue.bind(self._exchange, routing_key=key)
                except BaseException:
                    self._forget(key, watcher)
                    raise
        try:
            yield watcher
        finally:
            # Unbound in a task of its own: a stream ends by being cancelled, and a
            # cancelled scope would cancel an await here too.
            if self._forget(key, watcher):
                task = asyncio.create_task(self._unbind(key))
                self._unbinding.add(task)
                task.add_done_callback(self._unbinding.discard)

    async def _unbind(self, key: str) -> None:
        assert self._queue is not None and self._exchange is not None
        async with self._lock:
            if key in self._watchers:  # watched again meanwhile
                return
            try:
                await self._queue.unbind(self._exchange, routing_key=key)
            except Exception as exc:  # a closed channel dropped it anyway
                log.info("unbinding %s skipped: %r", key, exc)

    def _forget(self, key: str, watcher: Watcher) -> bool:
        """Drop ``watcher``; True when it was the key's last."""
        watchers = self._watchers.get(key, set())
        watchers.discard(watcher)
        if watchers:
            return False
        self._watchers.pop(key, None)
        return True

    def _deliver(self, message: Delivery) -> None:
        # case.<tenantId>.<caseId>.<EVENT_TYPE>
        parts = (message.routing_key or "").split(".")
        if len(parts) != 4:  # the four parts above
            return
        if not (self._watchers.get(case_key(parts[2]))
                or self._watchers.get(tenant_key(parts[1]))):
            return
        try:
            self.admission.authenticate(message.body, message.headers, message.user_id)
        except Refused as exc:
            key_id = self.admission.key_id_of(message.headers, message.user_id)
            if exc.code is DeadLetterCode.UNKNOWN_KEY and key_id is not None:
                # A key registered since the last read: read them, then decide.
                task = asyncio.create_task(self._after_reading_keys(message, key_id))
                self._waiting_for_keys.add(task)
                task.add_done_callback(self._waiting_for_keys.discard)
                return
            log.warning("event %s not streamed: %s", message.message_id, exc.reason)
            return
        self._offer(parts, message)

    async def _after_reading_keys(self, message: Delivery, key_id: str) -> None:
        await self.admission.keys.knows_all({key_id})
        try:
            self.admission.authenticate(message.body, message.headers, message.user_id)
        except Refused as exc:
            log.warning("event %s not streamed: %s", message.message_id, exc.reason)
            return
        self._offer((message.routing_key or "").split("."), message)

    def _offer(self, parts: list[str], message: Delivery) -> None:
        targets = [*self._watchers.get(case_key(parts[2]), ()),
                   *self._watchers.get(tenant_key(parts[1]), ())]
        event = _live_event(message) if targets else None
        if event is None:
            return
        for watcher in targets:
            watcher.offer(event)
