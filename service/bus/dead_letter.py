"""Setting a message aside, with the reason, on the dead-letter exchange.

A plain ``reject`` would dead-letter through the queue's policy but carry no
reason; republishing with a header says why, then the original is acked.
"""

from __future__ import annotations

import logging

from aio_pika.abc import AbstractIncomingMessage

from service.bus.publisher import Publisher
from service.bus.topology import Topology

log = logging.getLogger("casetrail.bus")

REASON_HEADER = "x-casetrail-reason"


async def dead_letter(
    publisher: Publisher, topology: Topology, message: AbstractIncomingMessage, reason: str
) -> None:
    """Publish ``message`` to ``<ns>.dead-letter`` with ``reason`` (confirmed); the caller acks."""
    log.warning("dead-lettering message %s: %s", message.message_id, reason)
    await publisher.publish(
        topology.dead_letter_exchange,
        message.routing_key or "",
        message.body,
        message_id=message.message_id,
        message_type=message.type,
        correlation_id=message.correlation_id,
        headers={
            REASON_HEADER: reason[:4000],
            "x-original-exchange": message.exchange or "",
            "x-original-routing-key": message.routing_key or "",
        },
    )
