"""The log partitioned for years, on the real Postgres: new cases' time-ordered ids land
in their month's partition; no component reaches a partition directly; a month goes
whole only through the owner's function, once every case in it has expired and none is
held, and its expired cases keep their CASE_EXPIRED and tombstone (the audit's checks of
expiries still hold)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import asyncpg
import pytest

from casetrail.adapters.store import component_pool
from casetrail.adapters.store.audit_log import AuditStore
from casetrail.config import Settings
from casetrail.contract.events import new_case_id
from tests.support.records import seeded_events
from tests.support.stack import namespace_of_its_own

MONTHS_AGO = 9
"""Old enough that the floor (183 days) has passed since the month ended."""

_CASE = """
INSERT INTO cases (case_id, agent, status, input, model, limits, request_digest,
                   created_at, ended_at, tenant_id)
VALUES ($1::uuid, 'loan-officer', 'completed', '{}', '{}', '{}', md5($1::uuid::text),
        now() - interval '270 days', now() - interval '270 days', 'default')
"""
_EVENT = seeded_events(
    "VALUES (gen_random_uuid(), $1::uuid, 1, $2::int, $3::text, now(), $4::jsonb, "
    "'default', repeat('0', 64), 'abcdefabcdefabcd', repeat('s', 86))")
_LOGGED = """
INSERT INTO ledger_leaves (leaf_index, event_id, case_id, event_hash)
SELECT (SELECT coalesce(max(leaf_index) + 1, 0) FROM ledger_leaves)
       + row_number() OVER (ORDER BY queued_id) - 1, event_id, case_id, hash
FROM ledger_queue
"""


def _month_start(months_ago: int) -> datetime:
    now = datetime.now(UTC)
    index = now.year * 12 + now.month - 1 - months_ago
    return datetime(index // 12, index % 12 + 1, 1, tzinfo=UTC)


async def test_a_month_is_dropped_whole_only_once_every_case_in_it_expired(
    settings: Settings,
) -> None:
    async with namespace_of_its_own(settings, "partitions") as (own, pool, _):
        month = await _old_month(pool)
        cases = await _cases_in(pool, month, 3)
        held = await pool.fetchval(
            "INSERT INTO legal_holds (tenant_id, scope, case_id, reason, placed_by) "
            "VALUES ('default', 'case', $1, 'Complaint 2026-9', 'carol') RETURNING hold_id",
            cases[2])
        worker = await component_pool(own.identity("worker"), 1)
        try:
            await _refused_to_components(own, worker, month)
            # Nothing expired yet: the month stays.
            assert await worker.fetchval("SELECT event_log_drop_expired_partitions()") == []
            for case_id in cases[:2]:
                assert await worker.fetchval("SELECT expire_case($1)", case_id) == 2
            with pytest.raises(asyncpg.PostgresError, match="legal hold"):
                await worker.fetchval("SELECT expire_case($1)", cases[2])
            # Two of three expired, the third held: the month stays still.
            assert await worker.fetchval("SELECT event_log_drop_expired_partitions()") == []
            assert await pool.fetchval("SELECT to_regclass($1) IS NOT NULL", month)
            await pool.execute(
                "INSERT INTO legal_hold_releases (hold_id, person, reason) VALUES "
                "($1, 'carol', 'settled'), ($1, 'dave', 'settled')", held)
            assert await worker.fetchval("SELECT expire_case($1)", cases[2]) == 2
            assert await worker.fetchval("SELECT event_log_drop_expired_partitions()") \
                == [month]
        finally:
            await worker.close()
        assert await pool.fetchval("SELECT to_regclass($1)", month) is None
        # Each expired case keeps its signed CASE_EXPIRED (now in the default partition)
        # and its tombstone; the audit's expiry and leaf checks find nothing amiss.
        kept = await pool.fetch("SELECT case_id, event_type, tableoid::regclass::text AS part "
                                "FROM event_log WHERE case_id = ANY($1::uuid[])", cases)
        assert sorted((r["case_id"], r["event_type"], r["part"]) for r in kept) == sorted(
            (c, "CASE_EXPIRED", "event_log_default") for c in cases)
        assert await pool.fetchval("SELECT count(*) FROM case_tombstones "
                                   "WHERE case_id = ANY($1::uuid[])", cases) == 3
        audit = AuditStore(pool)
        assert await audit.expiries_unaccounted() == []
        assert await audit.leaves_unmatched() == []
        assert await audit.events_unlogged() == []
        assert await audit.partitions_unguarded() == []


async def test_new_cases_land_in_their_months_partition(settings: Settings) -> None:
    async with namespace_of_its_own(settings, "partitions-now") as (_, pool, _):
        case_id = new_case_id()
        assert case_id.version == 7
        await pool.execute(_CASE, case_id)
        await pool.execute(_EVENT, case_id, 0, "CASE_STARTED", {})
        part = await pool.fetchval("SELECT tableoid::regclass::text FROM event_log "
                                   "WHERE case_id = $1", case_id)
        assert part == "event_log_" + datetime.now(UTC).strftime("%Y_%m")
        # Two years ahead are made already; asking again makes none.
        ahead = _month_start(-24)
        assert await pool.fetchval("SELECT to_regclass($1) IS NOT NULL",
                                   f"event_log_{ahead:%Y_%m}")
        assert await pool.fetchval("SELECT event_log_prepare_partitions(24)") == 0
        # An older random id stays in the default partition.
        legacy = uuid.UUID("f" + uuid.uuid4().hex[1:])
        await pool.execute(_CASE, legacy)
        await pool.execute(_EVENT, legacy, 0, "CASE_STARTED", {})
        assert await pool.fetchval("SELECT tableoid::regclass::text FROM event_log "
                                   "WHERE case_id = $1", legacy) == "event_log_default"


async def _old_month(pool: asyncpg.Pool) -> str:
    """A month's partition as the owner's function makes them, for a month long past:
    the tests cannot wait."""
    start = _month_start(MONTHS_AGO)
    assert await pool.fetchval("SELECT event_log_make_partition($1)", start) is True
    assert await pool.fetchval("SELECT event_log_make_partition($1)", start) is False
    return f"event_log_{start:%Y_%m}"


async def _cases_in(pool: asyncpg.Pool, month: str, n: int) -> list[uuid.UUID]:
    """``n`` ended cases of that month, each with a started and a completed event and
    its CASE_EXPIRED (the tombstone), every event taken by the log."""
    low = await pool.fetchval(
        "SELECT (regexp_match(pg_get_expr(relpartbound, oid), '''([0-9a-f-]+)'''))[1] "
        "FROM pg_class WHERE relname = $1", month)
    cases = [uuid.UUID(int=uuid.UUID(low).int + (i + 1) * (1 << 80)) for i in range(n)]
    for case_id in cases:
        await pool.execute(_CASE, case_id)
        await pool.execute(_EVENT, case_id, 0, "CASE_STARTED", {})
        await pool.execute(_EVENT, case_id, 1, "CASE_COMPLETED", {})
        await pool.execute(_EVENT, case_id, 2, "CASE_EXPIRED", {
            "policyId": 1, "policyVersion": 1, "eventsRemoved": 2, "heads": [],
            "expiredBy": "test"})
        assert await pool.fetchval("SELECT tableoid::regclass::text FROM event_log "
                                   "WHERE case_id = $1 LIMIT 1", case_id) == month
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(_LOGGED)
        await conn.execute("DELETE FROM ledger_queue")
    return cases


async def _refused_to_components(own: Settings, worker: asyncpg.Pool, month: str) -> None:
    """A partition reached directly would bypass the log's policies and triggers: no
    component may; nor drop it, nor empty the log."""
    for statement in (f"SELECT count(*) FROM {month}", f"DELETE FROM {month}",
                      f"DROP TABLE {month}", f"TRUNCATE {month}",
                      "TRUNCATE event_log"):
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await worker.execute(statement)
    consumer = await component_pool(own.identity("consumer"), 1)
    try:
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await consumer.execute(f"INSERT INTO {month} SELECT * FROM event_log LIMIT 0")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await consumer.fetchval("SELECT event_log_drop_expired_partitions()")
    finally:
        await consumer.close()
