"""Setting a message aside, with the reason, on the dead-letter exchange.

A plain ``reject`` would dead-letter through the queue's policy but carry no
reason; republishing with a header says why, then the original is acked.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

from casetrail.adapters.bus.connection import BusConnection, IncomingMessage
from casetrail.adapters.bus.publisher import Publisher
from casetrail.adapters.bus.topology import Topology
from casetrail.contract.dead_letters import DeadLetterCode
from casetrail.telemetry import metrics

log = logging.getLogger("casetrail.bus")

REASON_HEADER = "x-casetrail-reason"
DEAD_LETTERED_AT_HEADER = "x-casetrail-dead-lettered-at"
ORIGINAL_USER_HEADER = "x-casetrail-original-user-id"
"""The broker user that published the message set aside (its ``user_id``, which the
broker checked); a redrive trusts it only from the component that consumes where the
message came from (service/ops/dead_letters.py)."""


class Undeliverable(Protocol):
    """What setting a message aside needs to know of it (aio-pika's incoming
    messages and the consumer's raw deliveries both have it)."""

    @property
    def body(self) -> bytes: ...
    @property
    def message_id(self) -> str | None: ...
    @property
    def type(self) -> str | None: ...
    @property
    def correlation_id(self) -> str | None: ...
    @property
    def routing_key(self) -> str | None: ...
    @property
    def exchange(self) -> str | None: ...
    @property
    def headers(self) -> Mapping[str, Any] | None: ...
    @property
    def user_id(self) -> str | None: ...


async def dead_letter(
    publisher: Publisher, topology: Topology, message: Undeliverable, reason: str,
    code: DeadLetterCode = DeadLetterCode.REJECTED,
) -> None:
    """Publish ``message`` to ``<ns>.dead-letter`` with ``reason`` (confirmed); the caller
    acks. Its own headers are kept (an event's signature too), so that it can be sent
    back as it was (``casetrail dead-letters redrive``). ``code`` is the reason's
    class, one of a few words (the metric's label; the reason is free text)."""
    log.warning("dead-lettering message %s: %s", message.message_id, reason)
    await publisher.publish(
        topology.dead_letter_exchange,
        message.routing_key or "",
        message.body,
        message_id=message.message_id,
        message_type=message.type,
        correlation_id=message.correlation_id,
        headers={
            **(message.headers or {}),
            REASON_HEADER: reason[:4000],
            DEAD_LETTERED_AT_HEADER: datetime.now(UTC).isoformat(),
            "x-original-exchange": message.exchange or "",
            "x-original-routing-key": message.routing_key or "",
            ORIGINAL_USER_HEADER: message.user_id or "",
        },
    )
    metrics.DEAD_LETTERED.labels(code.value).inc()


@contextlib.asynccontextmanager
async def held(connection: BusConnection, topology: Topology, limit: int
               ) -> AsyncIterator[list[IncomingMessage]]:
    """Up to ``limit`` dead letters, oldest first, held unacknowledged: those not acked
    inside go back to the queue, in order, when this ends."""
    channel = await connection.channel()
    try:
        queue = await channel.get_queue(topology.dead_letter_queue, ensure=True)
        taken: list[IncomingMessage] = []
        while len(taken) < limit:
            message = await queue.get(no_ack=False, fail=False)
            if message is None:
                break
            taken.append(message)
        yield taken
    finally:
        await channel.close()
