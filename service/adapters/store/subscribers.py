"""The namespace's subscribers as the database keeps them (``casetrail subscribers``;
docs/operations.md, "Subscribers"): which tenant each reads, and when it was revoked.
Their broker users and queues are ops/subscribers.py's."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from casetrail.adapters.store.pool import Pool


@dataclass(frozen=True)
class KeptSubscriber:
    name: str
    tenant: str
    created_at: datetime
    revoked_at: datetime | None


class SubscriberStore:
    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    async def tenant_of(self, name: str) -> str | None:
        tenant: str | None = await self.pool.fetchval(
            "SELECT tenant_id FROM subscribers WHERE name = $1", name)
        return tenant

    async def keep(self, name: str, tenant: str) -> None:
        """The subscriber, kept (a revoked one made again is current again)."""
        await self.pool.execute(
            "INSERT INTO subscribers (name, tenant_id) VALUES ($1, $2) "
            "ON CONFLICT (name) DO UPDATE SET revoked_at = NULL", name, tenant)

    async def listed(self) -> list[KeptSubscriber]:
        rows = await self.pool.fetch("SELECT name, tenant_id, created_at, revoked_at "
                                     "FROM subscribers ORDER BY name")
        return [KeptSubscriber(r["name"], r["tenant_id"], r["created_at"], r["revoked_at"])
                for r in rows]

    async def revoke(self, name: str) -> bool:
        """Marks the subscriber revoked; ``False`` when there was none current."""
        return await self.pool.fetchval(
            "UPDATE subscribers SET revoked_at = now() WHERE name = $1 AND revoked_at IS NULL "
            "RETURNING name", name) is not None
