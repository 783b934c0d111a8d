"""Every exchange and queue casetrail uses, declared once, with the reliability
settings spelled out.

All names carry the namespace prefix (``CASETRAIL_NAMESPACE``), so tests and
benchmarks run beside a live stack without touching it.

    <ns>.events          topic, durable     every event; key case.<caseId>.<EVENT_TYPE>
      └─ <ns>.event-log  quorum queue       bound case.#; the consumer persists it
      └─ <ns>.checkpoints stream            bound ledger.#; the log's signed
                                            checkpoints, kept for witnesses to read
      └─ <ns>.log-head   stream             bound ledger.checkpoint; the newest
                                            checkpoints, no maximum age: the ledger's
                                            high-water mark off its database
    <ns>.commands        direct, durable    start commands
      └─ <ns>.case-start quorum queue       bound case.start, case.erase; the workers
    <ns>.cancel          fanout, durable    cancel broadcast; each worker binds an
                                            exclusive auto-delete queue
    <ns>.capabilities    direct, durable    WorkerTool requests; key = capability name
      └─ <ns>.capability.<name>  quorum     one per capability (declared by setup); an
                                            expired request is dropped, never kept
    <ns>.replies         direct, durable    tool replies; key = the caller's reply queue,
                                            which binds itself (no one writes to the
                                            default exchange, which reaches every queue)
    <ns>.dead-letter     fanout, durable    whatever cannot be processed
      └─ <ns>.dead-letters quorum queue     kept for an operator, with the reason
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel, AbstractExchange, AbstractQueue

from casetrail.errors import PermanentError

EVENT_LOG_DELIVERY_LIMIT = 5
"""A message redelivered this often (the consumer crashed on it each time) is dead-lettered.
RabbitMQ 3.10 quorum queues have no default limit, so it is set explicitly."""

CASE_START_DELIVERY_LIMIT = 50
"""Start commands come back on every worker death or graceful hand-back; a case must
not be dropped for that, so the limit is generous."""

CAPABILITY_DELIVERY_LIMIT = 5


@dataclass(frozen=True)
class Topology:
    """The names of one namespace's exchanges and queues."""

    namespace: str

    @property
    def events_exchange(self) -> str:
        return f"{self.namespace}.events"

    @property
    def event_log_queue(self) -> str:
        return f"{self.namespace}.event-log"

    @property
    def checkpoints_stream(self) -> str:
        return f"{self.namespace}.checkpoints"

    @property
    def log_head_stream(self) -> str:
        return f"{self.namespace}.log-head"

    @property
    def retention_journal_stream(self) -> str:
        return f"{self.namespace}.retention-journal"

    CHECKPOINT_KEY = "ledger.checkpoint"

    @property
    def commands_exchange(self) -> str:
        return f"{self.namespace}.commands"

    @property
    def case_start_queue(self) -> str:
        return f"{self.namespace}.case-start"

    @property
    def cancel_exchange(self) -> str:
        return f"{self.namespace}.cancel"

    @property
    def capabilities_exchange(self) -> str:
        return f"{self.namespace}.capabilities"

    def capability_queue(self, capability: str) -> str:
        return f"{self.namespace}.capability.{capability}"

    @property
    def replies_exchange(self) -> str:
        return f"{self.namespace}.replies"

    @property
    def dead_letter_exchange(self) -> str:
        return f"{self.namespace}.dead-letter"

    @property
    def dead_letter_queue(self) -> str:
        return f"{self.namespace}.dead-letters"

    EVERY_EVENT = "case.#"
    """The binding key of every event (``case.<tenant>.<caseId>.<EVENT_TYPE>``)."""

    @staticmethod
    def events_of(tenant: str | None = None, case_id: uuid.UUID | str | None = None,
                  event_type: str | None = None) -> str:
        """The binding key of the events of one tenant, one case, one type, or any mix."""
        if event_type is not None:
            return f"case.{tenant or '*'}.{case_id or '*'}.{event_type}"
        if case_id is not None:
            return f"case.{tenant or '*'}.{case_id}.#"
        return Topology.EVERY_EVENT if tenant is None else f"case.{tenant}.#"

    START_KEY = "case.start"
    JOURNAL_KEY = "retention.journal"
    """What people decided about keeping records, journalled off the database
    (casetrail.adapters.bus.journal)."""
    ERASE_KEY = "case.erase"
    """Erase commands share the start queue: the worker that takes start commands
    appends the case's CASE_ERASED."""

    def _quorum(self, delivery_limit: int) -> dict[str, Any]:
        # Quorum: replicated and durable, and it counts deliveries so that a
        # message which keeps killing its consumer is set aside instead of
        # looping forever.
        return {
            "x-queue-type": "quorum",
            "x-delivery-limit": delivery_limit,
            "x-dead-letter-exchange": self.dead_letter_exchange,
        }

    async def declare(self, channel: AbstractChannel) -> None:
        """Declare everything (idempotent: the same arguments every time)."""
        dlx = await channel.declare_exchange(
            self.dead_letter_exchange, aio_pika.ExchangeType.FANOUT, durable=True
        )
        dead = await channel.declare_queue(
            self.dead_letter_queue, durable=True, arguments={"x-queue-type": "quorum"}
        )
        await dead.bind(dlx, routing_key="#")
        events = await self.declare_events_exchange(channel)
        log = await channel.declare_queue(
            self.event_log_queue, durable=True, arguments=self._quorum(EVENT_LOG_DELIVERY_LIMIT)
        )
        await log.bind(events, routing_key=self.EVERY_EVENT)
        # A stream keeps every checkpoint for any number of readers, each from the
        # offset it wants (a witness from the first); bounded by age and size.
        checkpoints = await channel.declare_queue(
            self.checkpoints_stream, durable=True,
            arguments={"x-queue-type": "stream", "x-max-age": "90D",
                       "x-max-length-bytes": 1 << 30})
        await checkpoints.bind(events, routing_key="ledger.#")
        # The log's high-water mark off its database (casetrail.ledger.high_water): the
        # latest checkpoints with no maximum age, bounded by size (small segments, so the
        # newest are always kept).
        head = await channel.declare_queue(
            self.log_head_stream, durable=True,
            arguments={"x-queue-type": "stream", "x-max-length-bytes": 16 << 20,
                       "x-stream-max-segment-size-bytes": 1 << 20})
        await head.bind(events, routing_key=self.CHECKPOINT_KEY)
        commands = await channel.declare_exchange(
            self.commands_exchange, aio_pika.ExchangeType.DIRECT, durable=True
        )
        start = await channel.declare_queue(
            self.case_start_queue, durable=True, arguments=self._quorum(CASE_START_DELIVERY_LIMIT)
        )
        await start.bind(commands, routing_key=self.START_KEY)
        await start.bind(commands, routing_key=self.ERASE_KEY)
        # Holds, releases, policies, approvals, business dates and erasures, where a
        # restore cannot undo them: no maximum age, bounded by size.
        journal = await channel.declare_queue(
            self.retention_journal_stream, durable=True,
            arguments={"x-queue-type": "stream", "x-max-length-bytes": 4 << 30})
        await journal.bind(commands, routing_key=self.JOURNAL_KEY)
        await channel.declare_exchange(
            self.cancel_exchange, aio_pika.ExchangeType.FANOUT, durable=True
        )
        await channel.declare_exchange(
            self.capabilities_exchange, aio_pika.ExchangeType.DIRECT, durable=True
        )
        await channel.declare_exchange(
            self.replies_exchange, aio_pika.ExchangeType.DIRECT, durable=True
        )

    async def declare_events_exchange(self, channel: AbstractChannel) -> AbstractExchange:
        return await channel.declare_exchange(
            self.events_exchange, aio_pika.ExchangeType.TOPIC, durable=True
        )

    async def require(self, channel: AbstractChannel) -> None:
        """Check, passively, that the namespace's exchanges and queues exist: components
        may not declare them (``casetrail setup`` does, as the admin)."""
        exchanges = (self.events_exchange, self.commands_exchange, self.cancel_exchange,
                     self.capabilities_exchange, self.replies_exchange,
                     self.dead_letter_exchange)
        queues = (self.event_log_queue, self.case_start_queue, self.dead_letter_queue,
                  self.checkpoints_stream, self.log_head_stream,
                  self.retention_journal_stream)
        name = ""
        try:
            for name in exchanges:
                await channel.get_exchange(name, ensure=True)
            for name in queues:
                await channel.get_queue(name, ensure=True)
        except aiormq.exceptions.ChannelNotFoundEntity:
            raise PermanentError(f"the bus has no {name}: run `casetrail setup` for the "
                                 f"namespace {self.namespace}") from None

    def capability_arguments(self) -> dict[str, Any]:
        # Quorum like the rest, but no dead-letter exchange: a request that expired
        # unserved (its caller has given up and recorded the failure) or kept killing
        # its worker is dropped, so no queue keeps a tool's arguments after the call.
        return {"x-queue-type": "quorum", "x-delivery-limit": CAPABILITY_DELIVERY_LIMIT}

    async def declare_capability_queue(
        self, channel: AbstractChannel, capability: str
    ) -> AbstractQueue:
        """A capability's queue, bound (``casetrail setup`` declares every one: capability
        workers may only read theirs). A queue of an earlier version (dead-lettering what
        expired) is replaced: it holds nothing but requests whose callers time out."""
        exchange = await channel.get_exchange(self.capabilities_exchange, ensure=False)
        name = self.capability_queue(capability)
        # Declared on the channel underneath: a refused declaration closes the channel,
        # and aio-pika's robust channel would repeat it when it reopens.
        try:
            await (await channel.get_underlay_channel()).queue_declare(
                name, durable=True, arguments=self.capability_arguments())
        except aiormq.exceptions.ChannelPreconditionFailed:
            await channel.reopen()
            raw = await channel.get_underlay_channel()
            await raw.queue_delete(name, if_unused=False, if_empty=False)
            await raw.queue_declare(name, durable=True,
                                    arguments=self.capability_arguments())
        queue = await channel.get_queue(name, ensure=False)
        await queue.bind(exchange, routing_key=capability)
        return queue

    async def capability_queue_declared(self, channel: AbstractChannel, capability: str
                                        ) -> AbstractQueue:
        """A capability's queue, which must exist (``casetrail setup`` declares it)."""
        try:
            return await channel.get_queue(self.capability_queue(capability), ensure=True)
        except aiormq.exceptions.ChannelNotFoundEntity:
            raise PermanentError(f"the bus has no queue for capability {capability!r}: run "
                                 f"`casetrail setup` for the namespace {self.namespace}"
                                 ) from None

    async def delete_all(self, channel: AbstractChannel, capabilities: list[str]) -> None:
        """Remove the namespace (tests and benchmarks). Quorum queues refuse aio-pika's
        default ``if_unused=True``, which would close the connection."""
        queues = [self.event_log_queue, self.case_start_queue, self.dead_letter_queue,
                  self.checkpoints_stream, self.log_head_stream,
                  self.retention_journal_stream]
        queues += [self.capability_queue(c) for c in capabilities]
        for name in queues:
            await channel.queue_delete(name, if_unused=False, if_empty=False)
        for name in (
            self.events_exchange, self.commands_exchange, self.cancel_exchange,
            self.capabilities_exchange, self.replies_exchange, self.dead_letter_exchange,
        ):
            await channel.exchange_delete(name)
