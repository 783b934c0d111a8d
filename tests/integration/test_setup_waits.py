"""``casetrail setup`` waits for the services it needs: started while PostgreSQL does not
accept connections yet (here: its address is a forwarder that starts listening three
seconds later), it says what it waits for and completes once it can; given up on, it
is one line naming the service and what to do, exit 2, no traceback."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

from casetrail.components.supervisor import component_command
from casetrail.config import Settings
from casetrail.ops.setup import remove
from tests.support.stack import free_port, other_namespace


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    writer.close()


@contextlib.asynccontextmanager
async def forwarder_after(seconds: float, port: int, target: tuple[str, int]
                          ) -> AsyncIterator[None]:
    """``127.0.0.1:port`` forwarding to ``target``, listening only after ``seconds``."""
    async def forward(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(*target)
        await asyncio.gather(_pipe(client_r, server_w), _pipe(server_r, client_w))

    servers: list[asyncio.Server] = []

    async def later() -> None:
        await asyncio.sleep(seconds)
        servers.append(await asyncio.start_server(forward, "127.0.0.1", port))

    opening = asyncio.create_task(later())
    try:
        yield
    finally:
        opening.cancel()
        for server in servers:
            server.close()


async def test_setup_waits_for_postgres_then_sets_up(settings: Settings, database: str) -> None:
    own = other_namespace(settings, "waits")
    real = urlsplit(own.database_url)
    port = free_port()
    late = urlunsplit(real._replace(netloc=f"{real.username}@127.0.0.1:{port}"))
    try:
        async with forwarder_after(3.0, port, (real.hostname or "127.0.0.1", real.port or 5432)):
            done = await asyncio.to_thread(
                subprocess.run, component_command("setup"),
                env=own.environment(CASETRAIL_DATABASE_URL=late), capture_output=True,
                text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        assert f"waiting for PostgreSQL at 127.0.0.1:{port} to accept connections" \
            in done.stderr
        assert "migrations applied" in done.stdout
    finally:
        await remove(own)


def test_setup_gives_up_in_one_line(settings: Settings) -> None:
    own = other_namespace(settings, "gives-up")
    done = subprocess.run(
        component_command("setup"), check=False, capture_output=True, text=True, timeout=60,
        env=own.environment(CASETRAIL_AMQP_URL=f"amqp://guest:guest@127.0.0.1:{free_port()}/",
                            CASETRAIL_SERVICES_WAIT_SECONDS="2"))
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "╭" not in done.stderr
    [last] = [line for line in done.stderr.splitlines() if line.startswith("casetrail setup:")]
    assert "RabbitMQ at 127.0.0.1:" in last and "did not accept connections within 2 s" in last
    assert "CASETRAIL_AMQP_URL" in last
