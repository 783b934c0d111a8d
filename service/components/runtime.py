"""One way for every component to start and stop (docs/design.md, "The parts").

    async with component(settings, "consumer") as parts:
        connection = await parts.connection()
        pool = await parts.pool(4)
        ...
        await run_until_signal(consumer.run)

``component`` sets up what each long-running component needs before its own work:
traces (when ``OTEL_*`` asks), its metrics port, the bus's fast path, its own
least-privileged identity; ``parts.pool`` and ``parts.connection`` open its database
pool and broker connection as that identity, waiting for them at start; and on the way
out, whatever happened, it closes them in the reverse order and flushes the traces.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass

from casetrail.adapters.bus import fastpath
from casetrail.adapters.bus.connection import (
    STARTUP_PATIENCE_SECONDS,
    BusConnection,
    connect_patiently,
)
from casetrail.adapters.store import component_pool
from casetrail.adapters.store.pool import Pool
from casetrail.config import Component, Identity, Settings
from casetrail.telemetry import logs, metrics, tracing


@dataclass
class Parts:
    """A running component's settings, identity and the resources it opened."""

    settings: Settings
    name: Component
    stack: AsyncExitStack

    @property
    def identity(self) -> Identity:
        """The component's own identity (a capability worker has one per capability:
        ``settings.capability_identity``)."""
        return self.settings.identity(self.name)

    async def pool(self, size: int, patience: float | None = None) -> Pool:
        """A database pool as the component's role, closed when the component stops."""
        pool = await component_pool(self.identity, size, patience)
        self.stack.push_async_callback(pool.close)
        return pool

    async def connection(self, url: str | None = None, name: str | None = None,
                         patience: float = STARTUP_PATIENCE_SECONDS
                         ) -> BusConnection:
        """A robust broker connection as the component's user (or ``url``'s), closed
        when the component stops."""
        connection = await connect_patiently(url or self.identity.amqp_url,
                                             name or f"casetrail-{self.name}", patience)
        self.stack.push_async_callback(connection.close)
        return connection


def prepare(settings: Settings, name: Component) -> None:
    """What every component does first: traces when ``OTEL_*`` asks, its metrics port,
    the bus's fast path. The API does it before uvicorn starts (a taken metrics port is
    one clear error, not a failed lifespan); the others through ``component``."""
    logs.set_component(name)
    tracing.configure(name)
    metrics.serve(settings, name)
    fastpath.enable(settings.amqp_fastpath)


@asynccontextmanager
async def component(settings: Settings, name: Component) -> AsyncIterator[Parts]:
    """The component ``name``, set up; what it opened is closed, and its traces
    flushed, when the block ends."""
    prepare(settings, name)
    async with AsyncExitStack() as stack:
        stack.callback(tracing.shutdown)
        yield Parts(settings, name, stack)
