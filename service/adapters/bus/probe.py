"""How deep casetrail's queues are, for the metrics: a passive declare every few seconds.

A passive declare needs no permission beyond the queue's existence and answers
with its count of ready messages; each component probes the queues it works
from (the worker the start queue, the consumer the event-log and dead-letter
queues), on a channel of its own so a failed probe never closes a working one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import aiormq
from aio_pika.abc import AbstractRobustConnection

from casetrail.telemetry import metrics

log = logging.getLogger("casetrail.bus")

DEAD_LETTERS = "dead-letters"


@dataclass
class QueueProbe:
    """Sets ``casetrail_queue_messages{queue=<label>}`` for each of ``queues`` (label →
    queue name), and how long the dead-letter queue has held messages, if probed."""

    connection: AbstractRobustConnection
    queues: Mapping[str, str]
    every: float = 5.0
    _held_since: float | None = None

    async def run(self, stop: asyncio.Event) -> None:
        channel = await self.connection.channel()
        try:
            while not stop.is_set():
                for label, name in self.queues.items():
                    try:
                        queue = await channel.declare_queue(name, passive=True)
                    except (aiormq.exceptions.AMQPError, ConnectionError, TimeoutError) as exc:
                        log.debug("cannot probe %s: %r", name, exc)
                        continue
                    self.observe(label, queue.declaration_result.message_count or 0)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.every)
        finally:
            with contextlib.suppress(aiormq.exceptions.AMQPError, ConnectionError):
                await channel.close()

    def beside(self, work: Callable[[asyncio.Event], Awaitable[None]]
               ) -> Callable[[asyncio.Event], Awaitable[None]]:
        """``work(stop)`` with this probe running beside it until it returns."""

        async def both(stop: asyncio.Event) -> None:
            probing = asyncio.create_task(self.run(stop))
            try:
                await work(stop)
            finally:
                if not stop.is_set():  # the work failed: nobody else ends the probe
                    probing.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await probing

        return both

    def observe(self, label: str, count: int, now: float | None = None) -> None:
        metrics.QUEUE_MESSAGES.labels(label).set(count)
        if label != DEAD_LETTERS:
            return
        now = time.monotonic() if now is None else now
        if count == 0:
            self._held_since = None
        elif self._held_since is None:
            self._held_since = now
        held = 0.0 if self._held_since is None else now - self._held_since
        metrics.DEAD_LETTERS_HELD_SECONDS.set(held)
