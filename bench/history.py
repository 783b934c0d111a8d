"""Whether a durable cycle costs more when the log already holds a long history: the
end-to-end scenario (bench/e2e.py, 1,000 cases of 10 cycles, every feature on) against
an ``event_log`` that holds 10,000,000 and 25,000,000 events before the run.

Each history is seeded once into a cached database (``casetrail_bench_events_<N>``, kept
like the proof bench's tree) and used again by every later run; a run adds its own
10,000 events to it. The seeded cases are of the bench's tenant, ten events each (a
start, eight cycles, a completion) with compact payloads: the indexes the pipeline
writes (the log's keys, the cases' search indexes) are at full size, the heap smaller
than real events would make it, which keeps two histories within ~25 GB of disk. Seeded
events are not in the transparency log (they are written with its trigger off): the
run's own events are. The seeded cases have random ids, so they are in the log's default
partition (as an upgraded log's are); the run's own cases are in their month's.

    python -m bench.history [N ...]
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

import asyncpg

from bench.e2e import end_to_end
from bench.harness import bench_settings
from casetrail.adapters.store.migrate import database_name
from casetrail.config import Settings
from casetrail.ops.setup import setup
from tests.support.records import seeded_events

SIZES = (10_000_000, 25_000_000)
EVENTS_A_CASE = 10
_STEP = 100_000
"""Cases seeded a statement (a million events)."""

_CASES_SQL = """
INSERT INTO cases (case_id, agent, status, input, model, limits, request_digest,
                   created_at, updated_at, started_at, ended_at, cycles, tenant_id,
                   terminal_published, start_confirmed_at, start_publishing_until,
                   folded_attempt, folded_seq)
SELECT md5('seeded case ' || n)::uuid, 'throughput-probe', 'completed', '{"cycles": 8}',
       '{"provider": "scripted", "name": "seeded"}', '{}', md5(n::text), at, at, at,
       at + interval '90 ms', 8, 'default', true, at, at, 1, 9
FROM (SELECT n, timestamptz '2026-01-01' + n * interval '1 ms' AS at
      FROM generate_series($1::bigint, $2::bigint - 1) n) c
"""
_EVENTS_SQL = seeded_events("""
SELECT gen_random_uuid(), c.case_id, 1, s.seq,
       CASE s.seq WHEN 0 THEN 'CASE_STARTED' WHEN 9 THEN 'CASE_COMPLETED'
                  ELSE 'REACT_CYCLE' END,
       c.at + s.seq * interval '10 ms',
       jsonb_build_object('cycleIndex', s.seq - 1, 'reasoningText', 'a seeded cycle',
                          'toolCalls', jsonb_build_array(jsonb_build_object(
                              'toolName', 'probe', 'toolArgs', jsonb_build_object('n', s.seq),
                              'toolResult', jsonb_build_object('ok', true),
                              'toolSource', 'local', 'durationMs', 1))),
       'default', md5(c.case_id::text || (s.seq - 1)) || md5((s.seq - 1)::text), 'seeded',
       md5(c.case_id::text) || md5(s.seq::text) || md5(c.case_id::text || 'sig')
FROM (SELECT md5('seeded case ' || n)::uuid AS case_id,
             timestamptz '2026-01-01' + n * interval '1 ms' AS at
      FROM generate_series($1::bigint, $2::bigint - 1) n) c
CROSS JOIN generate_series(0, 9) AS s(seq)
""")
"""A history's events, shaped as the consumer stores signed ones (the log's constraint
holds their columns to their bodies); recorded_at is the insert's, not the event's."""


def cached(size: int) -> Settings:
    """The settings of the stack whose database holds a history of ``size`` events."""
    base = bench_settings()
    url = base.database_url.rsplit("/", 1)[0] + f"/casetrail_bench_events_{size}"
    return base.model_copy(update={"database_url": url,
                                   "namespace": f"casetrail-bench-events-{size}",
                                   "secrets_file": f".casetrail/bench-events-{size}.json"})


async def seeded(size: int) -> Settings:
    """The cached database of ``size`` events, seeded the first time (several minutes)."""
    settings = cached(size)
    await setup(settings)  # idempotent: roles, migrations, grants
    conn = await asyncpg.connect(settings.database_url)
    try:
        await conn.execute("CREATE TABLE IF NOT EXISTS bench_history (cases bigint NOT NULL)")
        done = await conn.fetchval("SELECT coalesce(max(cases), 0) FROM bench_history")
        wanted = size // EVENTS_A_CASE
        if done < wanted:
            print(f"seeding {database_name(settings.database_url)} with "
                  f"{size:,} events (once) ...", flush=True)
            await _seed(conn, done, wanted)
    finally:
        await conn.close()
    return settings


async def _seed(conn: asyncpg.Connection, done: int, wanted: int) -> None:
    """Cases ``done`` .. ``wanted`` and their events; the log's two indexes are built
    again after (far faster than growing them row by row), its ledger trigger off."""
    began = time.monotonic()
    await conn.execute("SET synchronous_commit = off; SET maintenance_work_mem = '1GB'")
    await conn.execute("ALTER TABLE event_log DISABLE TRIGGER event_log_enters_ledger; "
                       "ALTER TABLE event_log_default DROP CONSTRAINT IF EXISTS "
                       "event_log_default_event_id, DROP CONSTRAINT IF EXISTS "
                       "event_log_default_case_attempt_seq")
    for start in range(done, wanted, _STEP):
        end = min(start + _STEP, wanted)
        async with conn.transaction():
            await conn.execute(_CASES_SQL, start, end)
            await conn.execute(_EVENTS_SQL, start, end)
            await conn.execute("INSERT INTO bench_history VALUES ($1)", end)
        print(f"  {end * EVENTS_A_CASE:,} events, {time.monotonic() - began:.0f} s",
              flush=True)
    await conn.execute("ALTER TABLE event_log_default ADD CONSTRAINT "
                       "event_log_default_event_id PRIMARY KEY (event_id)")
    await conn.execute("ALTER TABLE event_log_default ADD CONSTRAINT "
                       "event_log_default_case_attempt_seq UNIQUE (case_id, attempt, seq) "
                       "INCLUDE (event_type)")
    await conn.execute("ALTER TABLE event_log ENABLE ALWAYS TRIGGER event_log_enters_ledger")
    await conn.execute("VACUUM (ANALYZE) event_log")
    await conn.execute("VACUUM (ANALYZE) cases")
    print(f"  seeded and indexed in {time.monotonic() - began:.0f} s", flush=True)


async def measure(scale: float = 1.0, sizes: tuple[int, ...] = SIZES
                  ) -> list[dict[str, Any]]:
    """The end-to-end figures against each history, labelled like bench/growth.py's."""
    measured = []
    for size in sizes:
        settings = await seeded(size)
        held = await _events(settings)
        print(f"  an event_log holding {held:,} events ...", flush=True)
        figures = await end_to_end(max(int(1000 * scale), 5), 10,
                                   settings=settings.model_copy(update={"api_port": 8790}),
                                   keep=True)
        measured.append({"work": f"an event_log holding {size:,} events",
                         "eventsBefore": held, **figures})
    return measured


async def _events(settings: Settings) -> int:
    """Events the cached log holds (the planner's count: exact enough, and instant)."""
    conn = await asyncpg.connect(settings.database_url)
    try:
        return int(await conn.fetchval(
            "SELECT reltuples::bigint FROM pg_class WHERE relname = 'event_log'"))
    finally:
        await conn.close()


async def main(sizes: tuple[int, ...]) -> None:
    from bench.growth import row

    print("| work | cycles | cycles/s | CPU-µs per cycle | per process |")
    print("|---|---|---|---|---|")
    for figures in await measure(1.0, sizes):
        print(row(figures["work"], figures), flush=True)


if __name__ == "__main__":
    asyncio.run(main(tuple(int(a) for a in sys.argv[1:]) or SIZES))
