"""Reading the log's published checkpoints back off the bus: the ledger's second anchor
(casetrail.ledger.high_water), and the API's watch on the log (casetrail.api.log_watch).
``<ns>.log-head`` keeps the latest checkpoints with no maximum age (16 MiB);
``<ns>.checkpoints`` (kept 90 days, 1 GiB) is read too, whole, so that a flood of old
checkpoints on the small stream does not push the largest out of what is read."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

import aiormq
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection

from casetrail.adapters.bus.topology import Topology

log = logging.getLogger("casetrail.ledger")

QUIET_SECONDS = 0.5
"""A stream read ends when nothing more arrived for this long."""
FIRST_SECONDS = 1.0
"""How long to wait for a stream's first message (an empty stream sends none)."""
PREFETCH = 2000
"""Messages of a stream in flight to one reader."""
ACK_EVERY = 500
"""A reader acknowledges a stream's messages this many at a time (a stream keeps them
whatever is acknowledged: the acknowledgement only renews the reader's credit)."""


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
        if len(bodies) % ACK_EVERY == 0:  # a stream's credit, renewed a batch at a time
            await message.ack(multiple=True)

    try:
        await channel.set_qos(prefetch_count=PREFETCH)
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
    """Every checkpoint on each stream that keeps them (each read from its first: a
    flood of old checkpoints must not push the largest out of what is read), by stream
    name."""
    names = (topology.log_head_stream, topology.checkpoints_stream)
    tails = await asyncio.gather(*(read_stream(connection, name, "first") for name in names))
    return list(zip(names, tails, strict=True))


async def follow_stream(connection: AbstractRobustConnection, name: str,
                        take: Callable[[bytes], Awaitable[None]]
                        ) -> Callable[[], Awaitable[None]] | None:
    """Hand every message of the stream ``name`` to ``take``, from its first and then as
    each arrives (again from the first after a reconnection); what stops it. ``None``
    when the bus has no such stream, or this user may not read it."""
    channel = await connection.channel()
    taken = 0

    async def keep(message: AbstractIncomingMessage) -> None:
        nonlocal taken
        await take(message.body)
        taken += 1
        if taken % ACK_EVERY == 0:
            await message.ack(multiple=True)

    try:
        await channel.set_qos(prefetch_count=PREFETCH)
        queue = await channel.get_queue(name, ensure=True)
        tag = await queue.consume(keep, arguments={"x-stream-offset": "first"})
    except (aiormq.exceptions.ChannelNotFoundEntity,
            aiormq.exceptions.ChannelAccessRefused) as exc:
        log.error("cannot follow the stream %s (%s): run `casetrail setup`, which declares "
                  "it and grants this user its reading", name, exc)
        with contextlib.suppress(Exception):
            await channel.close()
        return None

    async def stop() -> None:
        with contextlib.suppress(Exception):
            await queue.cancel(tag)
        with contextlib.suppress(Exception):
            await channel.close()

    return stop
