"""Reading the log's published checkpoints back off the bus: the ledger's second anchor
(casetrail.ledger.high_water). ``<ns>.log-head`` keeps the latest checkpoints with no
maximum age; ``<ns>.checkpoints`` (kept 90 days) is read too, so a namespace set up
before the log-head stream existed still has its anchor."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import aiormq
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection

from casetrail.adapters.bus.topology import Topology

log = logging.getLogger("casetrail.ledger")

QUIET_SECONDS = 0.5
"""A stream read ends when nothing more arrived for this long."""
FIRST_SECONDS = 1.0
"""How long to wait for a stream's first message (an empty stream sends none)."""


async def read_stream(connection: AbstractRobustConnection, name: str,
                      offset: str = "last") -> list[bytes]:
    """The messages of the stream ``name`` from ``offset`` (``last``: its last chunk, the
    newest messages; ``first``: all of them); empty if the stream is empty or missing."""
    channel = await connection.channel()
    bodies: list[bytes] = []
    arrived = asyncio.Event()

    async def keep(message: AbstractIncomingMessage) -> None:
        bodies.append(message.body)
        arrived.set()
        await message.ack()

    try:
        await channel.set_qos(prefetch_count=500)
        queue = await channel.get_queue(name, ensure=True)
        tag = await queue.consume(keep, arguments={"x-stream-offset": offset})
        wait = FIRST_SECONDS
        while True:
            arrived.clear()
            try:
                await asyncio.wait_for(arrived.wait(), wait)
            except TimeoutError:
                break
            wait = QUIET_SECONDS
        await queue.cancel(tag)
    except aiormq.exceptions.ChannelNotFoundEntity:
        log.info("the bus has no stream %s", name)
    finally:
        with contextlib.suppress(Exception):
            await channel.close()
    return bodies


async def published_checkpoints(connection: AbstractRobustConnection,
                                topology: Topology) -> list[tuple[str, list[bytes]]]:
    """The newest checkpoints on each stream that keeps them, by stream name."""
    names = (topology.log_head_stream, topology.checkpoints_stream)
    tails = await asyncio.gather(*(read_stream(connection, name) for name in names))
    return list(zip(names, tails, strict=True))
