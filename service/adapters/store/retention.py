"""What people set about keeping records, as the API keeps it: retention policies and
their approvals, business dates, legal holds and their releases. Every table is
append-only; the database decides whether a policy needs a second person and refuses
one person approving their own."""

from __future__ import annotations

import uuid
from datetime import date, datetime
from typing import Any

import asyncpg

from casetrail.adapters.store.expiry import HOLD_ACTIVE, PAST_TIME_SQL, key_held
from casetrail.adapters.store.pool import translate_errors


async def earlier_policies(pool: asyncpg.Pool, tenant: str, agent: str, version: int
                          ) -> list[dict[str, Any]]:
    """The versions of a (tenant, agent) policy before ``version``, newest first, with
    what the action key signed for each."""
    async with translate_errors():
        rows = await pool.fetch(
            f"SELECT {_POLICY_COLUMNS}, action FROM retention_policies WHERE tenant_id = $1 "
            "AND agent = $2 AND version < $3 ORDER BY version DESC", tenant, agent, version)
    return [dict(r) for r in rows]


_POLICY_COLUMNS = ("policy_id, tenant_id, agent, version, keep_days, counted_from, "
                   "business_key, personal_data_days, archive, preset, reason, set_by, set_at, "
                   "needs_second")


class Refused(Exception):
    """The database refused the row (a check, or the two-persons rule); the message
    says why."""


class Taken(Exception):
    """Another change took this version (or this person released it already)."""


class RetentionStore:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def floor(self) -> tuple[int, str]:
        """The floor no policy goes below (the owner's table: read here, written by the
        owner alone) and its source."""
        async with translate_errors():
            row = await self._pool.fetchrow("SELECT min_days, source FROM retention_floor")
        assert row is not None
        return int(row["min_days"]), str(row["source"])

    async def policies(self, tenant: str) -> list[dict[str, Any]]:
        """Every version of the tenant's policies, newest first, each with its approval
        and whether it is the one in force."""
        async with translate_errors():
            rows = await self._pool.fetch(
                f"SELECT {', '.join('p.' + c.strip() for c in _POLICY_COLUMNS.split(','))}, "
                "a.approved_by, a.approved_at, EXISTS (SELECT 1 FROM retention_in_force f "
                "WHERE f.policy_id = p.policy_id) AS in_force FROM retention_policies p "
                "LEFT JOIN retention_approvals a USING (policy_id) WHERE p.tenant_id = $1 "
                "ORDER BY p.agent, p.version DESC", tenant)
        return [dict(r) for r in rows]

    async def earlier(self, tenant: str, agent: str, version: int) -> list[dict[str, Any]]:
        """The versions before ``version`` of a (tenant, agent) policy, newest first."""
        return await earlier_policies(self._pool, tenant, agent, version)

    async def policy(self, policy_id: int) -> dict[str, Any] | None:
        async with translate_errors():
            row = await self._pool.fetchrow(
                f"SELECT {_POLICY_COLUMNS}, EXISTS (SELECT 1 FROM retention_approvals a "
                "WHERE a.policy_id = p.policy_id) AS approved FROM retention_policies p "
                "WHERE policy_id = $1", policy_id)
        return None if row is None else dict(row)

    async def next_version(self, tenant: str, agent: str) -> int:
        async with translate_errors():
            return int(await self._pool.fetchval(
                "SELECT coalesce(max(version), 0) + 1 FROM retention_policies WHERE "
                "tenant_id = $1 AND agent = $2", tenant, agent))

    async def set_policy(self, tenant: str, agent: str, version: int, fields: dict[str, Any],
                         by: str, at: datetime, action: dict[str, Any]) -> dict[str, Any]:
        """Version ``version`` of the (tenant, agent) policy (``Taken`` when another
        change took it); whether it needs a second person is the database's answer."""
        async with translate_errors():
            try:
                row = await self._pool.fetchrow(
                    f"""INSERT INTO retention_policies (tenant_id, agent, version, keep_days,
                            counted_from, business_key, personal_data_days, archive, preset,
                            reason, set_by, set_at, action)
                        VALUES ($1, $2, $3, $4, $5, $6, $7, $13, $8, $9, $10, $11, $12)
                        RETURNING {_POLICY_COLUMNS}""",
                    tenant, agent, version, fields["keep_days"], fields["counted_from"],
                    fields["business_key"], fields["personal_data_days"], fields["preset"],
                    fields["reason"], by, at, action, fields.get("archive", False))
            except asyncpg.UniqueViolationError as exc:
                raise Taken("another change of this policy was kept at the same time") \
                    from exc
            except asyncpg.CheckViolationError as exc:
                raise Refused(str(exc)) from exc
        assert row is not None
        return dict(row)

    async def approve(self, policy_id: int, by: str, at: datetime, action: dict[str, Any]
                      ) -> None:
        async with translate_errors():
            try:
                await self._pool.execute(
                    "INSERT INTO retention_approvals (policy_id, approved_by, approved_at, "
                    "action) VALUES ($1, $2, $3, $4)", policy_id, by, at, action)
            except asyncpg.UniqueViolationError as exc:
                raise Taken(f"policy {policy_id} is approved already") from exc
            except asyncpg.CheckViolationError as exc:
                raise Refused(str(exc)) from exc

    async def set_business_date(self, tenant: str, field: str, value: str, ended_on: date,
                                by: str, at: datetime) -> None:
        async with translate_errors():
            await self._pool.execute(
                "INSERT INTO retention_business_dates (tenant_id, field, value, ended_on, "
                "set_by, set_at) VALUES ($1, $2, $3, $4, $5, $6)", tenant, field, value,
                ended_on, by, at)

    async def plan(self, tenant: str, limit: int) -> list[dict[str, Any]]:
        """The tenant's cases past their time (or their personal data's), oldest first,
        with what keeps each (a hold)."""
        async with translate_errors():
            rows = await self._pool.fetch(
                f"WITH past AS ({PAST_TIME_SQL} AND c.tenant_id = $1) SELECT case_id, agent, "
                "policy_id, version, archive, counted_at, counted_at + make_interval(days => "
                "keep_days) AS expires_at, counted_at + make_interval(days => "
                "personal_data_days) AS personal_data_until, case_held(case_id, tenant_id) "
                "AS held FROM past WHERE (keep_days IS NOT NULL AND counted_at + "
                "make_interval(days => keep_days) < now()) OR (personal_data_days IS NOT NULL "
                "AND counted_at + make_interval(days => personal_data_days) < now()) "
                "ORDER BY counted_at LIMIT $2", tenant, limit)
        return [dict(r) for r in rows]

    async def place_hold(self, hold_id: uuid.UUID, tenant: str, scope: str,
                         case_id: uuid.UUID | None, key: tuple[str, str] | None, reason: str,
                         ends_at: datetime | None, by: str, at: datetime,
                         action: dict[str, Any]) -> dict[str, Any]:
        async with translate_errors():
            row = await self._pool.fetchrow(
                "INSERT INTO legal_holds (hold_id, tenant_id, scope, case_id, key_field, "
                "key_value, reason, ends_at, placed_by, placed_at, action) VALUES ($1, $2, "
                "$3, $4, $5, $6, $7, $8, $9, $10, $11) RETURNING *", hold_id, tenant, scope,
                case_id, key[0] if key else None, key[1] if key else None, reason, ends_at,
                by, at, action)
        assert row is not None
        return dict(row)

    async def holds(self, tenant: str, *, active_only: bool, case_id: uuid.UUID | None = None
                    ) -> list[dict[str, Any]]:
        """The tenant's holds, newest first, each with its releases; ``case_id``: only
        those that keep that case."""
        async with translate_errors():
            rows = await self._pool.fetch(
                f"""SELECT h.*, ({HOLD_ACTIVE}) AS active,
                           coalesce((SELECT jsonb_agg(jsonb_build_object(
                               'person', r.person, 'reason', r.reason,
                               'releasedAt', r.released_at) ORDER BY r.released_at)
                            FROM legal_hold_releases r WHERE r.hold_id = h.hold_id),
                            '[]'::jsonb) AS releases
                    FROM legal_holds h WHERE h.tenant_id = $1
                      AND (NOT $2 OR ({HOLD_ACTIVE}))
                      AND ($3::uuid IS NULL OR h.scope = 'tenant' OR h.case_id = $3
                           OR (h.scope = 'business_key' AND {key_held("$3")}))
                    ORDER BY h.placed_at DESC""", tenant, active_only, case_id)
        return [dict(r) for r in rows]

    async def hold(self, hold_id: uuid.UUID) -> dict[str, Any] | None:
        async with translate_errors():
            row = await self._pool.fetchrow("SELECT * FROM legal_holds WHERE hold_id = $1",
                                            hold_id)
        return None if row is None else dict(row)

    async def release(self, hold_id: uuid.UUID, person: str, reason: str, at: datetime,
                      action: dict[str, Any]) -> list[str]:
        """Keep ``person``'s release; everyone who has released the hold so far."""
        async with translate_errors():
            try:
                await self._pool.execute(
                    "INSERT INTO legal_hold_releases (hold_id, person, reason, released_at, "
                    "action) VALUES ($1, $2, $3, $4, $5)", hold_id, person, reason, at,
                    action)
            except asyncpg.UniqueViolationError as exc:
                raise Taken(f"{person} has released this hold already: a second person "
                            "releases it") from exc
            rows = await self._pool.fetch(
                "SELECT person FROM legal_hold_releases WHERE hold_id = $1 "
                "ORDER BY released_at", hold_id)
        return [r["person"] for r in rows]

    async def held(self, case_id: uuid.UUID, tenant: str) -> bool:
        async with translate_errors():
            return bool(await self._pool.fetchval("SELECT case_held($1, $2)", case_id, tenant))
