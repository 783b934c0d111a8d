"""Opening a robust broker connection, the one place casetrail does."""

from __future__ import annotations

import aio_pika
import aiormq
from aio_pika.abc import AbstractRobustConnection
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay, wait_fixed

from service.errors import BusUnavailable

STARTUP_PATIENCE_SECONDS = 60.0
"""How long a component waits for the broker to answer at start."""


async def connect(url: str, name: str) -> AbstractRobustConnection:
    """A robust connection: it reconnects and restores channels, queues and consumers."""
    try:
        return await aio_pika.connect_robust(url, client_properties={"connection_name": name})
    except (OSError, aiormq.exceptions.AMQPError) as exc:
        where = url.rsplit("@", maxsplit=1)[-1]
        raise BusUnavailable(f"cannot reach RabbitMQ at {where}: {exc}") from exc


async def connect_patiently(url: str, name: str,
                            patience: float = STARTUP_PATIENCE_SECONDS
                            ) -> AbstractRobustConnection:
    """A robust connection, waiting up to ``patience`` seconds for the broker at start-up."""
    async for attempt in AsyncRetrying(
        retry=retry_if_exception_type(BusUnavailable), wait=wait_fixed(1),
        stop=stop_after_delay(patience), reraise=True,
    ):
        with attempt:
            return await connect(url, name)
    raise AssertionError("unreachable")
