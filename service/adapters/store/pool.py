"""Pools as each component's own role, and asyncpg's exceptions translated at the
boundary: a lost or refused connection becomes ``StoreUnavailable``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from typing import TypeAlias

import asyncpg
import orjson
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay, wait_fixed

from casetrail.config import Identity
from casetrail.errors import PermanentError, StoreUnavailable

_TRANSIENT = (
    OSError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.CannotConnectNowError,
    asyncpg.TooManyConnectionsError,
    asyncpg.AdminShutdownError,
    # A connection left mid-operation by a server that went away reports this on
    # its next use; a fresh connection cures it.
    asyncpg.exceptions.InternalClientError,
)


Pool: TypeAlias = asyncpg.Pool
"""A pool of connections, for the annotations of the code that holds one."""

Connection: TypeAlias = asyncpg.Connection | asyncpg.pool.PoolConnectionProxy
"""One connection, on its own or taken from a pool."""

DatabaseError: TypeAlias = asyncpg.PostgresError
"""Any error the server reported; a lost connection is ``StoreUnavailable`` instead."""


async def server_answers(url: str) -> None:
    """Returns once the server at ``url`` answers: an answer that refuses (no such
    database yet, which setup makes; a wrong password) is for the next step to report."""
    try:
        connection = await asyncpg.connect(url, timeout=5)
    except asyncpg.CannotConnectNowError:
        raise  # "the database system is starting up"
    except asyncpg.PostgresError:
        return
    await connection.close()


HELD_SQLSTATE = "CTHLD"
"""What the database raises when a legal hold keeps the case it was asked to erase or
expire (migration 025)."""


class HeldByLaw(Exception):
    """The database refused: a legal hold keeps the case."""


@asynccontextmanager
async def translate_errors() -> AsyncIterator[None]:
    """Turn connection-level asyncpg failures into ``StoreUnavailable``."""
    try:
        yield
    except _TRANSIENT as exc:
        raise StoreUnavailable(f"Postgres unavailable: {type(exc).__name__}: {exc}") from exc


async def _init_connection(conn: asyncpg.Connection) -> None:
    for kind in ("json", "jsonb"):
        await conn.set_type_codec(
            kind, encoder=lambda v: orjson.dumps(v).decode(), decoder=orjson.loads,
            schema="pg_catalog",
        )


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Reset on release: nothing beyond asyncpg's own rollback of an open transaction.

    Pooled connections never change session state (no SET, LISTEN, advisory locks
    or cursors: migrations use a connection of their own), so asyncpg's default
    reset query would cost a round trip and server work on every release for nothing.
    """


async def create_pool(url: str, *, min_size: int = 1, max_size: int = 10,
                      name: str = "casetrail-admin") -> asyncpg.Pool:
    """A pool whose sessions say who they are (``application_name``)."""
    async with translate_errors():
        pool = await asyncpg.create_pool(
            url, min_size=min_size, max_size=max_size, init=_init_connection,
            reset=_keep_session, server_settings={"application_name": name},
        )
    assert pool is not None
    return pool


async def component_pool(identity: Identity, size: int,
                         patience: float | None = None) -> asyncpg.Pool:
    """A component's pool, as its own role (``casetrail-<component>`` in
    ``pg_stat_activity``); refuses a role that is a superuser."""
    pool = await pool_patiently(identity.database, size, name=f"casetrail-{identity.component}",
                                patience=STARTUP_PATIENCE_SECONDS if patience is None
                                else patience)
    if await pool.fetchval("SELECT current_setting('is_superuser') = 'on'"):
        await pool.close()
        raise PermanentError(f"the {identity.component}'s database role is a superuser: "
                             "components run with the least privilege (casetrail setup)")
    return pool


STARTUP_PATIENCE_SECONDS = 60.0
"""How long a component waits for the database to answer at start."""


async def pool_patiently(url: str, size: int, patience: float = STARTUP_PATIENCE_SECONDS,
                         name: str = "casetrail-admin") -> asyncpg.Pool:
    """A pool, waiting up to ``patience`` seconds for the database at start-up."""
    async for attempt in AsyncRetrying(
        retry=retry_if_exception_type(StoreUnavailable), wait=wait_fixed(1),
        stop=stop_after_delay(patience), reraise=True,
    ):
        with attempt:
            return await create_pool(url, max_size=size, name=name)
    raise AssertionError("unreachable")


def utc_text(value: datetime | None) -> str | None:
    """A stored time as the API writes it: ISO 8601 with ``Z``."""
    return None if value is None else value.isoformat().replace("+00:00", "Z")
