"""The event-log consumer: from ``<ns>.event-log`` into Postgres, exactly once.

It takes messages in batches (up to ``batch_size``, or whatever arrived
within ``linger`` of the first), validates each with the event contract,
writes the valid ones in one transaction, and only then acknowledges the
batch. Nothing is acknowledged before it is committed.

- A message that is not a genuine event (not published by the worker's identity,
  unsigned, a hash or signature that does not verify, an unknown or retired key:
  ``casetrail.consumers.admission``) or that it cannot read (bad JSON, an old or unknown
  schema version, a missing field, an unknown type, oversized) goes to the
  dead-letter exchange with the reason in its headers, and never touches
  ``cases``; its neighbours are stored.
- The same ``(caseId, attempt, seq)`` arriving with other signed bytes is
  dead-lettered as a conflict.
- Postgres unavailable: nothing is acknowledged; the batch is retried with
  backoff until it commits (or the consumer stops, and the broker redelivers).
- A database error caused by one event (not the connection) is isolated by
  writing the batch one event at a time; the culprit is dead-lettered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from tenacity import wait_exponential_jitter

from casetrail.adapters.bus.connection import BusConnection
from casetrail.adapters.bus.dead_letter import REASON_HEADER, dead_letter
from casetrail.adapters.bus.deliveries import Delivery, Subscription
from casetrail.adapters.bus.probe import DEAD_LETTERS, QueueProbe
from casetrail.adapters.bus.publisher import Publisher
from casetrail.adapters.bus.topology import Topology
from casetrail.adapters.store import KeyRegistry
from casetrail.adapters.store.pool import DatabaseError
from casetrail.adapters.store.writer import BatchOutcome, EventLogWriter
from casetrail.components.runtime import component
from casetrail.components.supervisor import run_until_signal
from casetrail.config import Settings
from casetrail.consumers.admission import Admission, KeyRing, Refused
from casetrail.contract.dead_letters import DeadLetterCode
from casetrail.contract.events import SignedEvent
from casetrail.engine.backoff import backoff_delay
from casetrail.errors import BusUnavailable, StoreUnavailable
from casetrail.telemetry import metrics, tracing

log = logging.getLogger("casetrail.consumer")

_STORE_BACKOFF = wait_exponential_jitter(multiplier=0.2, max=5.0)
_REFUSED = "database refused the event"

__all__ = ["REASON_HEADER", "ConsumerStats", "EventLogConsumer", "run_consumer"]

BUSY_BATCH = 10
"""A batch this large, taken within the first linger, says the consumer is under load."""


@dataclass
class ConsumerStats:
    """Running counts, for logs and tests."""

    batches: int = 0
    inserted: int = 0
    duplicates: int = 0
    dead_lettered: int = 0


class _Inbox:
    """Deliveries waiting to be batched.

    Cheap per message (a deque append; the waiting side is woken once per batch,
    not once per message): at thousands of events a second, an ``asyncio.Queue``
    with a timed ``get`` per message cost more than the message itself.
    """

    def __init__(self, batch_size: int) -> None:
        self._items: deque[Delivery] = deque()
        self._batch_size = batch_size
        self._arrived = asyncio.Event()
        self._full = asyncio.Event()

    def put(self, delivery: Delivery) -> None:
        self._items.append(delivery)
        if len(self._items) == 1:
            self._arrived.set()
        if len(self._items) >= self._batch_size:
            self._full.set()

    def wake(self) -> None:
        self._arrived.set()
        self._full.set()

    async def take(self, linger: float, stop: asyncio.Event) -> list[Delivery]:
        """Up to ``batch_size`` deliveries: waits for the first, then up to ``linger``
        seconds for the batch to fill. Empty when ``stop`` is set first."""
        while not self._items:
            if stop.is_set():
                return []
            self._arrived.clear()
            await self._arrived.wait()
        if len(self._items) < self._batch_size and linger > 0 and not stop.is_set():
            self._full.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(linger):
                    await self._full.wait()
        items = self._items
        return [items.popleft() for _ in range(min(len(items), self._batch_size))]


@dataclass
class EventLogConsumer:
    """Consumes ``<ns>.event-log`` and persists it with ``EventLogWriter``."""

    connection: BusConnection
    writer: EventLogWriter
    topology: Topology
    admission: Admission
    prefetch: int = 2000
    batch_size: int = 500
    linger: float = 0.005
    busy_linger: float = 0.025
    """The wait once the last batch held ``BUSY_BATCH`` events or more: events arrive
    faster than one a millisecond, and a batch five times larger costs Postgres and
    this process about a tenth less a cycle (docs/benchmarks.md)."""
    stats: ConsumerStats = field(default_factory=ConsumerStats)

    async def run(self, stop: asyncio.Event, ready: asyncio.Event | None = None) -> None:
        """Consume until ``stop`` is set; then finish or release the batch in flight."""
        channel = await self.connection.channel()
        await channel.set_qos(prefetch_count=self.prefetch)
        await self.topology.require(channel)
        dead_letters = await Publisher.open(self.connection)
        inbox = _Inbox(self.batch_size)
        subscription = Subscription(channel, self.topology.event_log_queue, inbox.put)
        await subscription.start()
        if ready is not None:
            ready.set()
        log.info("consuming %s", self.topology.event_log_queue)
        stopping = asyncio.create_task(stop.wait())
        stopping.add_done_callback(lambda _: inbox.wake())
        try:
            linger = self.linger
            while not stop.is_set():
                batch = await inbox.take(linger, stop)
                linger = self.linger_after(len(batch))
                if batch:
                    await self._handle(batch, dead_letters, stop)
        finally:
            stopping.cancel()
            # Unacknowledged messages (in the inbox, or a batch the store never
            # took) return to the queue when the channel closes.
            await subscription.cancel()
            await dead_letters.channel.close()
            await channel.close()

    def linger_after(self, taken: int) -> float:
        """How long the next batch may wait to fill, after one of ``taken`` events:
        lingering longer pays only under load; idle, an event is stored at once."""
        return self.busy_linger if taken >= BUSY_BATCH else self.linger

    async def _handle(
        self,
        batch: list[Delivery],
        dead_letters: Publisher,
        stop: asyncio.Event,
    ) -> None:
        key_ids = {k for m in batch
                   if (k := self.admission.key_id_of(m.headers, m.user_id))}
        if not await self._know_keys(key_ids, stop):
            return  # stopping during an outage: the broker redelivers the batch
        began = time.time_ns()
        readable: list[tuple[Delivery, SignedEvent]] = []
        rejected: list[tuple[Delivery, str, DeadLetterCode]] = []
        admit = self.admission.admit
        for message in batch:
            try:
                readable.append((message, admit(message.body, message.headers,
                                                message.user_id)))
            except Refused as exc:
                rejected.append((message, exc.reason, exc.code))
        writing = time.perf_counter()
        outcome = await self._write([signed for _, signed in readable], stop)
        if outcome is None:
            return  # stopping during an outage: the broker redelivers the batch
        metrics.COMMIT_SECONDS.observe(time.perf_counter() - writing)
        for index, reason in outcome.conflicts.items():
            rejected.append((readable[index][0], reason,
                             DeadLetterCode.DATABASE_REFUSED if reason.startswith(_REFUSED)
                             else DeadLetterCode.CONFLICT))
        for message, reason, code in rejected:
            await dead_letter(dead_letters, self.topology, message, reason, code)
        await self._ack(batch)
        self.stats.batches += 1
        self.stats.inserted += outcome.inserted
        self.stats.duplicates += outcome.duplicates
        self.stats.dead_lettered += len(rejected)
        metrics.BATCH_SIZE.observe(len(batch))
        metrics.EVENTS_STORED.inc(outcome.inserted)
        metrics.EVENTS_DUPLICATE.inc(outcome.duplicates)
        if readable:
            oldest = min(signed.event.occurred_at for _, signed in readable)
            metrics.CONSUMER_LAG.set(max(0.0, time.time() - oldest.timestamp()))
        if tracing.ENABLED:
            self._trace_store(batch, began, outcome)

    def _trace_store(self, batch: Sequence[Delivery], began: int,
                     outcome: BatchOutcome) -> None:
        """A ``store`` span in each sampled trace the batch had events of (one per trace
        and batch, not per event), from the batch's start to its acknowledgement."""
        first_of: dict[str, Delivery] = {}
        counts: dict[str, int] = {}
        for message in batch:
            trace_id = tracing.sampled(message.headers)
            if trace_id is not None:
                first_of.setdefault(trace_id, message)
                counts[trace_id] = counts.get(trace_id, 0) + 1
        for trace_id, message in first_of.items():
            with tracing.continued(message.headers):
                span = tracing.start(f"store {self.topology.event_log_queue}",
                                     tracing.SpanKind.CONSUMER, {
                                         "messaging.system": "rabbitmq",
                                         "messaging.operation.type": "process",
                                         "messaging.destination.name":
                                             self.topology.event_log_queue,
                                         "messaging.batch.message_count": len(batch),
                                         "db.system.name": "postgresql",
                                         "casetrail.events": counts[trace_id],
                                         "casetrail.batch.inserted": outcome.inserted,
                                     }, start_time=began)
                span.end()

    async def _wait_out_outage(self, exc: StoreUnavailable, failures: int,
                               stop: asyncio.Event) -> bool:
        """Back off after a Postgres outage; False when told to stop meanwhile."""
        delay = backoff_delay(_STORE_BACKOFF, failures)
        log.warning("store unavailable (%s); retrying in %.1fs", exc, delay)
        try:
            await asyncio.wait_for(stop.wait(), delay)
            return False
        except TimeoutError:
            return True

    async def _know_keys(self, key_ids: set[str], stop: asyncio.Event) -> bool:
        """Read the registered keys again if the batch names one not seen yet."""
        failures = 0
        while True:
            try:
                await self.admission.keys.knows_all(key_ids)
                return True
            except StoreUnavailable as exc:
                failures += 1
                if not await self._wait_out_outage(exc, failures, stop):
                    return False

    async def _write(self, signed: Sequence[SignedEvent], stop: asyncio.Event
                     ) -> BatchOutcome | None:
        """Commit the batch, waiting out a Postgres outage; ``None`` if told to stop first."""
        failures = 0
        while True:
            try:
                return await self.writer.write(signed)
            except StoreUnavailable as exc:
                failures += 1
                if not await self._wait_out_outage(exc, failures, stop):
                    return None
            except DatabaseError as exc:
                if len(signed) == 1:
                    return BatchOutcome(0, 0, {0: f"{_REFUSED}: {exc}"})
                log.warning("batch refused (%s); isolating the event that caused it", exc)
                return await self._write_one_by_one(signed, stop)

    async def _write_one_by_one(self, signed: Sequence[SignedEvent], stop: asyncio.Event
                                ) -> BatchOutcome | None:
        inserted = duplicates = 0
        conflicts: dict[int, str] = {}
        for index, one in enumerate(signed):
            outcome = await self._write([one], stop)
            if outcome is None:
                return None
            inserted += outcome.inserted
            duplicates += outcome.duplicates
            if outcome.conflicts:
                conflicts[index] = outcome.conflicts[0]
        return BatchOutcome(inserted, duplicates, conflicts)

    async def _ack(self, batch: list[Delivery]) -> None:
        """Acknowledge the whole batch: one ``multiple`` ack per channel it came on.

        A message from a channel that has since closed cannot be acked; the
        broker redelivers it and the idempotent insert absorbs the repeat.
        """
        last_by_channel: dict[int, Delivery] = {}
        for message in batch:
            last_by_channel[id(message.channel)] = message
        for message in last_by_channel.values():
            try:
                await message.ack(multiple=True)
            except BusUnavailable as exc:
                log.info("ack on a closed channel skipped (%s); redelivery is harmless", exc)


async def run_consumer(settings: Settings) -> None:
    """The ``casetrail consumer`` component, until SIGINT or SIGTERM."""
    async with component(settings, "consumer") as parts:
        connection = await parts.connection()
        pool = await parts.pool(4)
        keys = KeyRing(KeyRegistry(pool))
        await keys.refresh(force=True)
        consumer = EventLogConsumer(
            connection, EventLogWriter(pool), Topology(settings.namespace),
            Admission(settings.broker_user("worker"), keys),
            prefetch=settings.consumer_prefetch, batch_size=settings.consumer_batch_size,
            linger=settings.consumer_linger_ms / 1000,
            busy_linger=max(settings.consumer_busy_linger_ms, settings.consumer_linger_ms) / 1000,
        )
        topology = consumer.topology
        probe = QueueProbe(connection, {"event-log": topology.event_log_queue,
                                        DEAD_LETTERS: topology.dead_letter_queue},
                           settings.queue_probe_seconds)
        await run_until_signal(probe.beside(consumer.run))
    log.info("consumer stopped: %s", consumer.stats)
