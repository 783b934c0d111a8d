"""What expiry costs, and what it gives back: a log of N events (10 a case, each of the
size a real REACT_CYCLE stores), every case tombstoned as its CASE_EXPIRED leaves it,
then every case expired through the owner's ``expire_case()`` in batches, as the
retention pass does; then their month's partition dropped whole, as the pass drops a
month every case of which expired. The cases have time-ordered ids of 400 days ago, so
they are in that month's partition. Figures: events removed a second, the log's size on
disk (every partition) before, after expiry and VACUUM, after the month is dropped, and
after the same number of events is written again (into another old month), and bytes per
event on disk.

The events are written by SQL, not signed by a worker (signing 1,000,000 events is the
end-to-end benchmark's business, not this one's): the triggers, the checks and the
deletes are the ones a real expiry runs.

    python -m bench.retention [events]
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from typing import Any

import asyncpg

from casetrail.adapters.store.migrate import drop_database, migrate, with_database
from casetrail.config import Settings
from tests.support.records import seeded_events

EVENTS_PER_CASE = 10
BATCH = 1_000
"""Cases expired a statement, as a pass takes them."""

_CASES = """
INSERT INTO cases (case_id, agent, status, input, model, limits, request_digest,
                   created_at, ended_at, tenant_id)
SELECT old_case(ns, g), 'loan-officer', 'completed',
       '{"applicantId": "A-1001", "applicantName": "[pii:applicantName]"}', '{}', '{}',
       md5(g::text), now() - interval '400 days', now() - interval '400 days', 'default'
FROM generate_series($1::int, $2::int) g, (SELECT $3::uuid AS ns) n
"""
_EVENTS = seeded_events("""
SELECT gen_random_uuid(), old_case(ns, g), 1, s,
       CASE WHEN s = 0 THEN 'CASE_STARTED' WHEN s = $4::int - 1 THEN 'CASE_COMPLETED'
            ELSE 'REACT_CYCLE' END,
       now() - interval '400 days', p.payload, 'default', repeat('0', 64),
       'abcdefabcdefabcd', repeat('s', 86)
FROM generate_series($1::int, $2::int) g, generate_series(0, $4::int - 1) s,
     (SELECT $3::uuid AS ns) n,
     (SELECT jsonb_build_object('cycleIndex', 1, 'reasoningText', repeat('reasoning ', 80),
        'toolCalls', jsonb_build_array(jsonb_build_object('toolName', 'credit_bureau',
        'toolArgs', jsonb_build_object('applicantId', 'A-1001'), 'toolResult',
        jsonb_build_object('score', 712, 'history', repeat('x', 300)), 'durationMs', 12)),
        'tokenUsage', jsonb_build_object('inputTokens', 900, 'outputTokens', 120))
      AS payload) p
""")
_EXPIRED = seeded_events("""
SELECT gen_random_uuid(), old_case(ns, g), 1, $4::int, 'CASE_EXPIRED', now(),
       jsonb_build_object('policyId', 1, 'policyVersion', 1, 'eventsRemoved', $4::int,
                          'heads', '[]'::jsonb, 'expiredBy', 'bench'),
       'default', repeat('0', 64), 'abcdefabcdefabcd', repeat('s', 86)
FROM generate_series($1::int, $2::int) g, (SELECT $3::uuid AS ns) n
""")


# Time-ordered ids of cases started 400 days ago (one per "namespace" millisecond), and
# the partition of their month, made as the migration makes a month's.
_OLD_CASE = """
CREATE FUNCTION old_case(ns uuid, g integer) RETURNS uuid LANGUAGE sql IMMUTABLE AS $$
    SELECT (left(replace(ns::text, '-', ''), 12) || '7' || lpad(to_hex(g), 19, '0'))::uuid
$$
"""


async def _old_month(conn: asyncpg.Connection, offset_days: int) -> tuple[uuid.UUID, str]:
    """A millisecond ``offset_days`` ago, as a case id prefix, and its month's partition."""
    start = await conn.fetchval("SELECT date_trunc('month', now() - make_interval("
                                "days => $1), 'UTC')", offset_days)
    name = f"event_log_{start:%Y_%m}"
    await conn.execute("SELECT event_log_make_partition($1)", start)
    prefix = await conn.fetchval("SELECT uuid7_floor(now() - make_interval(days => $1))",
                                 offset_days)
    return prefix, name


async def _write(conn: asyncpg.Connection, cases: int, namespace: uuid.UUID) -> float:
    began = time.perf_counter()
    for first in range(0, cases, 10_000):
        last = min(first + 10_000, cases) - 1
        await conn.execute(_CASES, first, last, namespace)
        await conn.execute(_EVENTS, first, last, namespace, EVENTS_PER_CASE)
    await _logged(conn)
    return time.perf_counter() - began


async def _logged(conn: asyncpg.Connection) -> None:
    """As if the ledger had taken every queued event: a leaf each, the queue emptied."""
    await conn.execute(
        "INSERT INTO ledger_leaves (leaf_index, event_id, case_id, event_hash) SELECT "
        "(SELECT coalesce(max(leaf_index) + 1, 0) FROM ledger_leaves) + row_number() OVER "
        "(ORDER BY queued_id) - 1, event_id, case_id, hash FROM ledger_queue")
    await conn.execute("TRUNCATE ledger_queue")


async def _size(conn: asyncpg.Connection) -> int:
    """The log's bytes on disk: every partition's, with its indexes and TOAST."""
    return int(await conn.fetchval("SELECT sum(pg_total_relation_size(relid)) "
                                   "FROM pg_partition_tree('event_log')"))


async def expiry_cost(events: int) -> dict[str, Any]:
    settings = Settings()
    url = with_database(settings.database_url, "casetrail_bench_retention")
    await drop_database(url)
    await migrate(url)
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(_OLD_CASE)
        cases = events // EVENTS_PER_CASE
        namespace, month = await _old_month(conn, 400)
        await _write(conn, cases, namespace)
        await conn.execute("VACUUM ANALYZE event_log")
        before = await _size(conn)
        stored = int(await conn.fetchval("SELECT count(*) FROM event_log"))
        await conn.execute(_EXPIRED, 0, cases - 1, namespace, EVENTS_PER_CASE)
        await _logged(conn)
        began = time.perf_counter()
        removed = 0
        while True:
            done = await conn.fetchval(
                "SELECT sum(expire_case(case_id)) FROM (SELECT t.case_id FROM "
                "case_tombstones t JOIN cases c USING (case_id) LIMIT $1) due", BATCH)
            if done is None:
                break
            removed += int(done)
        seconds = time.perf_counter() - began
        await conn.execute("VACUUM event_log")
        after_expiry = await _size(conn)
        began = time.perf_counter()
        dropped = await conn.fetchval("SELECT event_log_drop_expired_partitions()")
        drop_seconds = time.perf_counter() - began
        assert dropped == [month], (dropped, month)
        after_drop = await _size(conn)
        namespace, _ = await _old_month(conn, 370)  # the same number of events again
        await _write(conn, cases, namespace)
        await conn.execute("VACUUM event_log")
        rewritten = await _size(conn)
    finally:
        await conn.close()
        await drop_database(url)
    return {"events": stored, "cases": cases, "eventsRemoved": removed,
            "expirySeconds": round(seconds, 1),
            "eventsRemovedPerSecond": round(removed / seconds),
            "partitionDropSeconds": round(drop_seconds, 2),
            "bytesPerEventOnDisk": round(before / stored),
            "tableBytesBefore": before, "tableBytesAfterExpiryAndVacuum": after_expiry,
            "tableBytesAfterPartitionDrop": after_drop,
            "tableBytesAfterWritingAsManyAgain": rewritten,
            "growthAfterRewriteRatio": round(rewritten / before, 3)}


if __name__ == "__main__":
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    print(asyncio.run(expiry_cost(count)))
