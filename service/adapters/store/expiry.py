"""What the worker's retention pass reads and does in Postgres (casetrail.components.
retention): the cases past their time under the policy in force, their chain heads, and
the owner's functions that erase personal data and expire a tombstoned case. The
database, not this code, refuses to touch a held or un-tombstoned case."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import asyncpg

from casetrail.adapters.store.journal import missing
from casetrail.adapters.store.pool import HELD_SQLSTATE, HeldByLaw, translate_errors
from casetrail.contract.events import ENDED_SQL, ChainHead

PAST_TIME_SQL = f"""
SELECT c.case_id, c.tenant_id, c.agent, p.policy_id, p.version, p.keep_days,
       p.counted_from, p.personal_data_days, p.archive, s.counted_at
FROM cases c
JOIN LATERAL (SELECT * FROM retention_in_force p
              WHERE p.tenant_id = c.tenant_id AND p.agent IN (c.agent, '*')
              ORDER BY p.agent = '*' LIMIT 1) p ON true
CROSS JOIN LATERAL (SELECT CASE p.counted_from WHEN 'ended' THEN c.ended_at ELSE (
        SELECT d.ended_on::timestamptz FROM retention_business_dates d
        JOIN case_keys k ON k.field = d.field AND k.value = d.value
        WHERE k.case_id = c.case_id AND d.tenant_id = c.tenant_id
          AND d.field = p.business_key
        ORDER BY d.set_at DESC LIMIT 1) END AS counted_at) s
WHERE c.status IN ({ENDED_SQL}) AND s.counted_at IS NOT NULL
"""
"""Every ended case under a policy, with the time its policy counts from (none until a
business date is set, for a policy counted from one)."""

PARTITION_MONTHS_AHEAD = 24
"""How far ahead of today the log's monthly partitions are kept made (migration 031)."""


def key_held(case: str) -> str:
    """SQL: the hold ``h`` names a business key the case ``case`` has, or had (a
    sensitive key's digest, kept after erasure or expiry in case_key_marks)."""
    return (f"(EXISTS (SELECT 1 FROM case_keys k WHERE k.case_id = {case} AND k.field = "
            f"h.key_field AND k.value = h.key_value) OR EXISTS (SELECT 1 FROM case_key_marks "
            f"m WHERE m.case_id = {case} AND m.field = h.key_field AND m.digest = "
            f"h.key_value))")


_EXPIRED_DUE = (f"WITH past AS ({PAST_TIME_SQL}) SELECT past.*, case_held(case_id, tenant_id) "
                "AS held FROM past WHERE keep_days IS NOT NULL AND counted_at + "
                "make_interval(days => keep_days) < now()")
_ERASE_DUE = (f"WITH past AS ({PAST_TIME_SQL}) SELECT past.*, case_held(case_id, tenant_id) "
              "AS held FROM past WHERE personal_data_days IS NOT NULL AND counted_at + "
              "make_interval(days => personal_data_days) < now() AND EXISTS (SELECT 1 FROM "
              "case_secrets x WHERE x.case_id = past.case_id AND x.erased_at IS NULL)")


@dataclass(frozen=True)
class PastTime:
    """A case whose time under ``policy_id`` (version ``version``) is up."""

    case_id: uuid.UUID
    tenant_id: str
    agent: str
    policy_id: int
    version: int
    keep_days: int | None
    counted_from: Literal["ended", "business_date"]
    held: bool
    archive: bool = False
    """The policy archives the case's bundle before it expires."""


@dataclass(frozen=True)
class HoldToRecord:
    """A hold that keeps an ended case whose trail does not say so yet (or, released,
    says it still holds)."""

    case_id: uuid.UUID
    hold_id: uuid.UUID
    scope: Literal["case", "business_key", "tenant"]
    reason: str
    placed_by: str
    placed_at: datetime
    ends_at: datetime | None
    released_by: tuple[str, ...] = ()
    ended_at: datetime | None = None


HOLD_ACTIVE = ("(h.ends_at IS NULL OR h.ends_at > now()) AND (SELECT count(*) FROM "
                "legal_hold_releases r WHERE r.hold_id = h.hold_id) < 2")
"""SQL: the hold ``h`` keeps what it names now (the rule case_held() applies)."""


@dataclass(frozen=True)
class Backlog:
    """What the retention gauges show: cases past their time not expired yet, those a
    hold keeps, and when the oldest such time ran out."""

    past_time: int
    held: int
    oldest_due: datetime | None


class NotYet(Exception):
    """The database refused: the case has no tombstone, the log has not taken all of
    its events, or its policy archives and its tombstone names no archive; the next pass
    tries again."""


def _past(rows: list[asyncpg.Record]) -> list[PastTime]:
    return [PastTime(r["case_id"], r["tenant_id"], r["agent"], r["policy_id"], r["version"],
                     r["keep_days"], r["counted_from"], r["held"], r["archive"])
            for r in rows]


@dataclass(frozen=True)
class ExpiryStore:
    pool: asyncpg.Pool

    async def policies_in_force(self) -> list[dict[str, Any]]:
        """Every policy in force that deletes anything, with its approval, and what the
        action key signed for each (the pass acts only on those that check)."""
        async with translate_errors():
            rows = await self.pool.fetch(
                "SELECT p.*, a.approved_by, a.approved_at, a.action AS approval_action "
                "FROM retention_in_force p LEFT JOIN retention_approvals a USING (policy_id) "
                "WHERE p.keep_days IS NOT NULL OR p.personal_data_days IS NOT NULL")
        return [dict(r) for r in rows]

    async def releases_keeping(self, case_id: uuid.UUID) -> list[dict[str, Any]]:
        """The holds on the case that two persons' releases ended (not their end time),
        each with its releases and what the action key signed for them."""
        async with translate_errors():
            rows = await self.pool.fetch(
                f"""SELECT h.hold_id, jsonb_agg(jsonb_build_object(
                           'person', r.person, 'reason', r.reason,
                           'releasedAt', r.released_at, 'action', r.action)) AS releases
                    FROM legal_holds h JOIN cases c ON c.case_id = $1
                         AND c.tenant_id = h.tenant_id
                    JOIN legal_hold_releases r USING (hold_id)
                    WHERE (h.ends_at IS NULL OR h.ends_at > now())
                      AND (h.scope = 'tenant' OR h.case_id = $1
                           OR (h.scope = 'business_key' AND {key_held("$1")}))
                    GROUP BY h.hold_id HAVING count(*) >= 2""", case_id)
        return [dict(r) for r in rows]

    async def any_policy(self) -> bool:
        """Whether any policy in force deletes anything (else there is nothing to do)."""
        async with translate_errors():
            return bool(await self.pool.fetchval(
                "SELECT EXISTS (SELECT 1 FROM retention_in_force WHERE keep_days IS NOT NULL "
                "OR personal_data_days IS NOT NULL)"))

    async def to_expire(self, limit: int, trusted: list[int]) -> list[PastTime]:
        """Cases past their time under a ``trusted`` policy, with no tombstone yet,
        oldest first (held ones too: they are counted, never expired)."""
        async with translate_errors():
            return _past(await self.pool.fetch(
                f"{_EXPIRED_DUE} AND policy_id = ANY($2::bigint[]) AND NOT EXISTS (SELECT 1 "
                "FROM case_tombstones t WHERE t.case_id = past.case_id) ORDER BY counted_at "
                "LIMIT $1", limit, trusted))

    async def to_erase(self, limit: int, trusted: list[int]) -> list[PastTime]:
        """Cases whose personal data is past its ``trusted`` policy's deadline and still
        kept."""
        async with translate_errors():
            return _past(await self.pool.fetch(
                f"{_ERASE_DUE} AND policy_id = ANY($2::bigint[]) ORDER BY counted_at "
                "LIMIT $1", limit, trusted))

    async def backlog(self, trusted: list[int]) -> Backlog:
        async with translate_errors():
            row = await self.pool.fetchrow(
                f"SELECT count(*) FILTER (WHERE NOT held) AS due, count(*) FILTER (WHERE "
                f"held) AS held, min(counted_at + make_interval(days => keep_days)) FILTER "
                f"(WHERE NOT held) AS oldest FROM ({_EXPIRED_DUE}) due WHERE policy_id = "
                f"ANY($1::bigint[])", trusted)
        assert row is not None
        return Backlog(row["due"], row["held"], row["oldest"])

    async def tombstoned(self, limit: int) -> list[uuid.UUID]:
        """Cases whose CASE_EXPIRED is stored and whose other events are not gone yet."""
        async with translate_errors():
            rows = await self.pool.fetch(
                "SELECT t.case_id FROM case_tombstones t JOIN cases c USING (case_id) "
                "ORDER BY t.expired_at LIMIT $1", limit)
        return [r["case_id"] for r in rows]

    async def chain_heads(self, case_id: uuid.UUID) -> tuple[int, list[ChainHead]]:
        """The number of the case's events, and each attempt's last one."""
        async with translate_errors():
            rows = await self.pool.fetch(
                "SELECT attempt, seq, event_id, hash FROM "
                "(SELECT DISTINCT ON (attempt) attempt, seq, event_id, hash FROM event_log "
                "WHERE case_id = $1 ORDER BY attempt, seq DESC) heads ORDER BY attempt",
                case_id)
            total = await self.pool.fetchval(
                "SELECT count(*) FROM event_log WHERE case_id = $1", case_id)
        return int(total), [ChainHead(attempt=r["attempt"], seq=r["seq"],
                                      event_id=r["event_id"], hash=r["hash"]) for r in rows]

    async def holds_to_record(self, limit: int) -> list[HoldToRecord]:
        """Ended cases a hold keeps whose trail has no CASE_HELD for it yet."""
        async with translate_errors():
            rows = await self.pool.fetch(
                f"""SELECT c.case_id, h.hold_id, h.scope, h.reason, h.placed_by,
                           h.placed_at, h.ends_at
                    FROM legal_holds h JOIN cases c ON c.tenant_id = h.tenant_id
                    WHERE {HOLD_ACTIVE} AND c.status IN ({ENDED_SQL})
                      AND (h.scope = 'tenant' OR (h.scope = 'case' AND c.case_id = h.case_id)
                           OR (h.scope = 'business_key' AND {key_held("c.case_id")}))
                      AND NOT EXISTS (SELECT 1 FROM held_cases x WHERE x.hold_id = h.hold_id
                                      AND x.case_id = c.case_id)
                    ORDER BY h.placed_at, c.case_id LIMIT $1""", limit)
        return [HoldToRecord(r["case_id"], r["hold_id"], r["scope"], r["reason"],
                             r["placed_by"], r["placed_at"], r["ends_at"]) for r in rows]

    async def releases_to_record(self, limit: int) -> list[HoldToRecord]:
        """Cases whose trail says a hold keeps them, after that hold ended."""
        async with translate_errors():
            rows = await self.pool.fetch(
                f"""SELECT x.case_id, h.hold_id, h.scope, h.reason, h.placed_by,
                           h.placed_at, h.ends_at,
                           coalesce((SELECT array_agg(r.person ORDER BY r.released_at)
                                     FROM legal_hold_releases r
                                     WHERE r.hold_id = h.hold_id), '{{}}') AS released_by,
                           CASE WHEN h.ends_at IS NOT NULL AND h.ends_at <= now()
                                THEN h.ends_at ELSE (SELECT max(r.released_at) FROM
                                legal_hold_releases r WHERE r.hold_id = h.hold_id) END
                             AS ended_at
                    FROM held_cases x JOIN legal_holds h USING (hold_id)
                    WHERE NOT x.released AND NOT ({HOLD_ACTIVE})
                    ORDER BY h.placed_at, x.case_id LIMIT $1""", limit)
        return [HoldToRecord(r["case_id"], r["hold_id"], r["scope"], r["reason"],
                             r["placed_by"], r["placed_at"], r["ends_at"],
                             tuple(r["released_by"]), r["ended_at"]) for r in rows]

    async def journal_missing(self, entries: list[dict[str, Any]]) -> list[int]:
        """The positions of the retention journal's entries this database lacks."""
        return await missing(self.pool, entries)

    async def expire(self, case_id: uuid.UUID) -> int:
        """The owner's ``expire_case``: the events removed."""
        async with translate_errors():
            try:
                return int(await self.pool.fetchval("SELECT expire_case($1)", case_id))
            except asyncpg.PostgresError as exc:
                raise _refusal(exc) from exc

    async def prepare_partitions(self, months_ahead: int = PARTITION_MONTHS_AHEAD) -> int:
        """The owner's ``event_log_prepare_partitions``: the months' partitions made now
        (none, but once a month)."""
        async with translate_errors():
            return int(await self.pool.fetchval("SELECT event_log_prepare_partitions($1)",
                                                months_ahead))

    async def drop_expired_partitions(self) -> list[str]:
        """The owner's ``event_log_drop_expired_partitions``: the months dropped whole,
        every case in them expired and none held."""
        async with translate_errors():
            return list(await self.pool.fetchval("SELECT event_log_drop_expired_partitions()"))


def _refusal(exc: asyncpg.PostgresError) -> Exception:
    code = getattr(exc, "sqlstate", None)
    if code == HELD_SQLSTATE:
        return HeldByLaw(str(exc))
    if code in ("CTTMB", "CTLOG", "CTARC"):
        return NotYet(str(exc))
    return exc
