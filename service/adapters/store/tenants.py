"""Per-tenant readers and the counts behind quotas and rates."""

from __future__ import annotations

import asyncpg

from casetrail.adapters.store.pool import translate_errors
from casetrail.contract.events import ACTIVE_SQL


class TenantReaders:
    """Login roles for SQL users that see one tenant's rows (row-level security)."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def create(self, role: str, tenant: str, password: str) -> None:
        """Create (or re-grant) ``role`` for ``tenant`` with ``password``, idempotently."""
        async with translate_errors(), self._pool.acquire() as conn, conn.transaction():
            exists = await conn.fetchval("SELECT 1 FROM pg_roles WHERE rolname = $1", role)
            verb = "ALTER" if exists else "CREATE"
            await conn.execute(await conn.fetchval(
                f"SELECT format('{verb} ROLE %I LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE "
                "NOINHERIT PASSWORD %L', $1::text, $2::text)", role, password))
            grants = await conn.fetchval(
                "SELECT format('GRANT CONNECT ON DATABASE %I TO %I; "
                "GRANT USAGE ON SCHEMA public TO %I; "
                "GRANT SELECT ON event_log, cases, react_cycles, react_tool_calls, "
                "case_decisions, case_reviews TO %I', "
                "current_database(), $1::text, $1::text, $1::text)", role)
            await conn.execute(grants)
            await conn.execute(
                """INSERT INTO tenant_readers (role_name, tenant_id) VALUES ($1, $2)
                   ON CONFLICT (role_name) DO UPDATE SET tenant_id = excluded.tenant_id""",
                role, tenant)

    async def drop(self, role: str) -> None:
        async with translate_errors(), self._pool.acquire() as conn, conn.transaction():
            await conn.execute("DELETE FROM tenant_readers WHERE role_name = $1", role)
            if await conn.fetchval("SELECT 1 FROM pg_roles WHERE rolname = $1", role):
                await conn.execute(await conn.fetchval(
                    "SELECT format('DROP OWNED BY %I; DROP ROLE %I', $1::text, $1::text)",
                    role))


async def tenant_counts(pool: asyncpg.Pool, tenant: str, max_active: int,
                        max_per_minute: int) -> tuple[int, int]:
    """``(cases queued or running, cases started in the last minute)`` of ``tenant``, each
    counted only up to its limit, so a check costs the same however busy a tenant is."""
    async with translate_errors():
        row = await pool.fetchrow(
            f"""SELECT
                 (SELECT count(*) FROM (SELECT 1 FROM cases WHERE tenant_id = $1
                    AND status IN ({ACTIVE_SQL}) LIMIT $2) a) AS active,
                 (SELECT count(*) FROM (SELECT 1 FROM cases WHERE tenant_id = $1
                    AND created_at > now() - interval '1 minute' LIMIT $3) r) AS recent""",
            tenant, max_active, max_per_minute)
    assert row is not None
    return int(row["active"]), int(row["recent"])


async def rate_wait(pool: asyncpg.Pool, tenant: str, max_per_minute: int) -> int:
    """Seconds until the oldest of the tenant's last ``max_per_minute`` starts leaves the
    one-minute window (at least 1)."""
    async with translate_errors():
        wait = await pool.fetchval(
            """SELECT ceil(extract(epoch FROM min(created_at) + interval '1 minute' - now()))
               FROM (SELECT created_at FROM cases WHERE tenant_id = $1
                     AND created_at > now() - interval '1 minute'
                     ORDER BY created_at DESC LIMIT $2) w""", tenant, max_per_minute)
    return max(1, int(wait or 1))
