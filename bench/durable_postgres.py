"""Durable once, the Postgres experiment (``python -m bench.durable postgres``): the
consumer's own statement (the insert, which the owner's trigger folds into ``cases``, one
transaction a batch)
writing real-shaped events into the partitioned log, as it is and with one change each,
and Postgres's CPU in the case path told apart by the component whose connection spent
it (``python -m bench.durable attribution``)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import orjson

from bench.e2e import PORT, end_to_end
from bench.harness import bench_settings, cpu_seconds, median_run, namespace, service_cpu
from bench.raw import sample_cycles
from casetrail.adapters.store.writer import _INSERT
from casetrail.config import Settings
from casetrail.contract.events import Event, event_payload_json, new_case_id
from casetrail.contract.integrity import canonical, chain_hash

BATCH = 500
"""The consumer's default batch (``CASETRAIL_CONSUMER_BATCH_SIZE``)."""

CYCLES_A_CASE = 10
CASES_AT_ONCE = 64
"""Cases whose events interleave in a batch, as concurrent cases' do."""


def _columns(events: list[Event]) -> tuple[list[Any], ...]:
    """The consumer's statement's arguments for ``events``, signed-shaped: the body is
    the event's canonical bytes, its hash the chain hash over it (the log's constraint
    holds the columns to the body), the signature of real length."""
    bodies = [e.to_json() for e in events]
    return _signed_shape(
        [e.event_id for e in events], [e.case_id for e in events],
        [e.attempt for e in events], [e.seq for e in events],
        [e.event_type for e in events], [e.occurred_at for e in events],
        [event_payload_json(e).decode() for e in events],
        [e.tenant_id for e in events], bodies)


def _signed_shape(event_ids: list[Any], case_ids: list[Any], attempts: list[Any],
                  seqs: list[Any], types: list[Any], times: list[Any], payloads: list[Any],
                  tenants: list[Any], bodies: list[bytes]) -> tuple[list[Any], ...]:
    prevs = [hashlib.sha256(b"prev" + e.bytes).hexdigest() for e in event_ids]
    return (event_ids, case_ids, attempts, seqs, types, times, [2 for _ in bodies],
            payloads, tenants, prevs,
            [chain_hash(p, b) for p, b in zip(prevs, bodies, strict=True)],
            ["0123456789abcdef" for _ in bodies],
            [base64.b64encode(os.urandom(64)).decode() for _ in bodies], bodies)


def _batches(events: int, size: int = BATCH) -> list[tuple[list[Any], ...]]:
    """``events`` REACT_CYCLE events of 10-cycle cases (UUIDv7 ids: this month's
    partition), 64 cases at a time interleaved, cut into batches of ``size``."""
    ordered: list[Event] = []
    cases = [sample_cycles(CYCLES_A_CASE) for _ in range(events // CYCLES_A_CASE)]
    for first in range(0, len(cases), CASES_AT_ONCE):
        group = cases[first:first + CASES_AT_ONCE]
        ordered += [case[i] for i in range(CYCLES_A_CASE) for case in group]
    return [_columns(ordered[i:i + size]) for i in range(0, len(ordered), size)]


_STAGING = ("CREATE TEMP TABLE IF NOT EXISTS incoming (event_id uuid, case_id uuid, "
            "attempt int, seq int, event_type text, occurred_at timestamptz, "
            "schema_version smallint, payload text, tenant_id text, prev_hash text, "
            "hash text, key_id text, sig text, body bytea) ON COMMIT DELETE ROWS")
# The consumer's statement reading the batch from the staging table instead of arrays.
_FROM_STAGING = (_INSERT.split("FROM unnest", 1)[0] + "FROM incoming AS r\n"
                 + "ON CONFLICT" + _INSERT.split("ON CONFLICT", 1)[1])


async def _cases_for(conn: asyncpg.Connection, batches: list[tuple[list[Any], ...]]) -> None:
    ids = sorted({c for batch in batches for c in batch[1]})
    await conn.execute(
        "INSERT INTO cases (case_id, agent, status, input, model, limits, request_digest) "
        "SELECT id, 'bench', 'running', '{}', '{}', '{}', 'bench' FROM unnest($1::uuid[]) id",
        ids)


Write = Callable[[asyncpg.Connection, tuple[list[Any], ...]], Awaitable[None]]


async def _with_arrays(conn: asyncpg.Connection, batch: tuple[list[Any], ...]) -> None:
    await conn.fetch(_INSERT, *batch)


async def _with_copy(conn: asyncpg.Connection, batch: tuple[list[Any], ...]) -> None:
    async with conn.transaction():
        await conn.copy_records_to_table("incoming", records=list(zip(*batch, strict=True)))
        await conn.fetch(_FROM_STAGING)


async def _write_all(conn: asyncpg.Connection, batches: list[tuple[list[Any], ...]],
                     write: Write) -> dict[str, Any]:
    backend = await conn.fetchval("SELECT pg_backend_pid()")
    await conn.execute("CHECKPOINT")
    before, own = service_cpu()["postgres"], cpu_seconds(backend)
    started = time.perf_counter()
    for batch in batches:
        await write(conn, batch)
    elapsed = time.perf_counter() - started
    count = sum(len(b[0]) for b in batches)
    total, own = service_cpu()["postgres"] - before, cpu_seconds(backend) - own
    return {"events": count, "eventsPerSecond": round(count / elapsed),
            "postgresCpuMicroseconds": round(total / count * 1e6, 1),
            "backendCpuMicroseconds": round(own / count * 1e6, 1)}


async def _month_keys(conn: asyncpg.Connection) -> list[str]:
    return [r["conname"] for r in await conn.fetch(
        "SELECT conname FROM pg_constraint WHERE conname LIKE 'event_log_%_case_event'")]


_VARIANTS: dict[str, list[str]] = {
    "as today": [],
    "one key fewer": ["keys"],
    "no ledger queue row": ["ALTER TABLE event_log DISABLE TRIGGER event_log_enters_ledger"],
    # What holding the served values costs (migration 033, 034): the columns checked
    # against the signed bytes, the owner's fold, the erasure trigger's look at a batch.
    "no body constraint": ["ALTER TABLE event_log DROP CONSTRAINT event_log_restates_body"],
    "no fold trigger": ["ALTER TABLE event_log DISABLE TRIGGER event_log_folds_into_cases"],
    "no erasure trigger": ["ALTER TABLE event_log DISABLE TRIGGER event_log_erases_values"],
    "COPY into staging": [],
    "as today, batches of 20": [],
}
SMALL_BATCH = 20
"""About what the consumer takes at a time in the end-to-end run (2,000 events/s, 5 ms
of linger)."""


def _renamed(batches: list[tuple[list[Any], ...]]) -> list[tuple[list[Any], ...]]:
    """``batches`` as other cases' events: new case ids (UUIDv7, this month) and event
    ids in the bodies and the columns, the rest as it was; cheaper than making events
    again."""
    cases: dict[uuid.UUID, uuid.UUID] = {}
    renamed = []
    for batch in batches:
        event_ids = [uuid.uuid4() for _ in batch[0]]
        case_ids = [cases.setdefault(c, new_case_id()) for c in batch[1]]
        bodies = []
        for event_id, case_id, body in zip(event_ids, case_ids, batch[13], strict=True):
            wire = orjson.loads(body)
            wire["eventId"], wire["caseId"] = str(event_id), str(case_id)
            bodies.append(canonical(wire))
        renamed.append(_signed_shape(event_ids, case_ids, batch[2], batch[3], batch[4],
                                     batch[5], batch[7], batch[8], bodies))
    return renamed


_MADE: dict[tuple[int, int], list[tuple[list[Any], ...]]] = {}


def _events_of(events: int, size: int) -> list[tuple[list[Any], ...]]:
    """Batches of ``events`` made once a run, then renamed for each use."""
    if (events, size) not in _MADE:
        _MADE[events, size] = _batches(events, size)
    return _renamed(_MADE[events, size])


async def postgres_variant(name: str, events: int, prefill: int = 0) -> dict[str, Any]:
    """One variant on a fresh namespace; ``prefill`` events written first (same month,
    same statement) and not measured."""
    settings = bench_settings()
    async with namespace(settings):
        conn = await asyncpg.connect(settings.database_url)
        try:
            return await _variant_on(conn, name, events, prefill)
        finally:
            await conn.close()


async def _variant_on(conn: asyncpg.Connection, name: str, events: int, prefill: int
                      ) -> dict[str, Any]:
    """The variant ``name`` on ``conn``'s fresh database."""
    for change in _VARIANTS[name]:
        if change == "keys":
            for key in await _month_keys(conn):
                table = key.removesuffix("_case_event")
                await conn.execute(f'ALTER TABLE "{table}" DROP CONSTRAINT "{key}"')
        else:
            await conn.execute(change)
    write: Write = _with_arrays
    if name == "COPY into staging":
        await conn.execute(_STAGING)
        write = _with_copy
    # Warm: the statement planned, the catalogs and the month's pages read, as in a
    # consumer that has been running.
    prefill = max(prefill, 5_000)
    for first in range(0, prefill, events):
        filler = _events_of(events, BATCH)[:(prefill - first + BATCH - 1) // BATCH]
        await _cases_for(conn, filler)
        for batch in filler:
            await _with_arrays(conn, batch)
    await conn.execute("VACUUM ANALYZE event_log")
    batches = _events_of(events, SMALL_BATCH if name.endswith(f"of {SMALL_BATCH}")
                         else BATCH)
    await _cases_for(conn, batches)
    figures = await _write_all(conn, batches, write)
    size = await conn.fetchval(
        "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_inherits i "
        "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'event_log'::regclass")
    stored = await conn.fetchval("SELECT count(*) FROM event_log")
    return {"variant": name + (f", {prefill:,} events before" if prefill > 5_000 else ""),
            **figures, "bytesPerEvent": round(size / stored)}


async def postgres(events: int, rounds: int = 3, prefill: int = 1_000_000
                   ) -> list[dict[str, Any]]:
    rows = []
    for name in _VARIANTS:
        runs = [await postgres_variant(name, events) for _ in range(rounds)]
        rows.append(median_run(runs, "postgresCpuMicroseconds"))
    if prefill:
        rows.append(await postgres_variant("as today", events, prefill))
    return rows


class RoleCpu:
    """Postgres CPU by the role a backend serves (each component connects as its own),
    read every half second from ``pg_stat_activity`` and each backend's /proc entry."""

    def __init__(self, database: str) -> None:
        self.database = database
        self.first: dict[int, tuple[str, float]] = {}
        self.last: dict[int, float] = {}

    async def follow(self, stop: asyncio.Event) -> None:
        conn = await asyncpg.connect(Settings().database_url.rsplit("/", 1)[0] + "/postgres")
        try:
            while not stop.is_set():
                for row in await conn.fetch(
                        "SELECT pid, coalesce(usename, backend_type) AS who FROM "
                        "pg_stat_activity WHERE datname = $1 OR datname IS NULL",
                        self.database):
                    try:
                        cpu = cpu_seconds(row["pid"])
                    except OSError:
                        continue
                    self.first.setdefault(row["pid"], (row["who"], cpu))
                    self.last[row["pid"]] = cpu
                await asyncio.sleep(0.5)
        finally:
            await conn.close()

    def by_role(self) -> dict[str, float]:
        totals: dict[str, float] = {}
        for pid, (who, first) in self.first.items():
            totals[who] = totals.get(who, 0.0) + self.last[pid] - first
        return totals


async def postgres_in_the_case_path(cases: int = 1000) -> dict[str, Any]:
    """``bench.e2e``'s 10-cycle cases, with Postgres's CPU told apart by the component
    whose connection spent it: what of a cycle's Postgres share the log's insert is."""
    settings = bench_settings(api_port=PORT)
    follower = RoleCpu(settings.database_url.rsplit("/", 1)[1])
    stop = asyncio.Event()
    following = asyncio.create_task(follower.follow(stop))
    try:
        figures = await end_to_end(cases, CYCLES_A_CASE, settings=settings)
    finally:
        stop.set()
        await following
    cycles = figures["cycles"]
    prefix = settings.namespace + "_"
    shares = {who.removeprefix(prefix): round(cpu / cycles * 1e6, 1)
              for who, cpu in sorted(follower.by_role().items()) if cpu > 0}
    return {"cycles": cycles, "cyclesPerSecond": figures["cyclesPerSecond"],
            "postgresCpuMicrosecondsByRole": shares}
