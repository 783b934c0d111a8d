"""Durable once, not twice: where a durable event's cost goes, by experiment.

Three experiments, each against the path as it is, all processes on this machine:

``broker``
    The bus's share of an event: persistent, confirmed publishes of real event bytes
    into a quorum queue (today's ``<ns>.event-log``) and into a stream, consumed as they
    arrive with batched acks (the consumer's prefetch and batch), on the single node and
    on the three-node cluster (faults/cluster.py). Reported: events/s and the broker's
    CPU-µs an event (every Erlang VM on the machine).
``postgres``
    Postgres's share of an event: the consumer's own statement (insert and fold, one
    transaction a batch) writing real-shaped events into the partitioned log, and the
    same with one change each: one unique key fewer (the month's ``(case_id,
    event_id)``), no transparency-log queue row per event (the upper bound of appending
    leaves per batch), the batch COPYed into a staging table first, and the log already
    holding millions of events in the same month. Reported: events/s and every Postgres
    process's CPU-µs an event (the backend, WAL writer, checkpointer, autovacuum).
``worker``
    The worker's share of a model turn: ``bench.models`` (the real ``openai`` provider
    against the 300 ms model at concurrency 256) with uvloop and with asyncio's own loop,
    and with two worker processes of 128 each.

Usage: ``python -m bench.durable [broker|postgres|worker ...] [EVENTS]``.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import aiormq
import asyncpg

from bench.e2e import PORT, end_to_end
from bench.harness import bench_settings, cpu_seconds, namespace, service_cpu
from bench.raw import sample_cycles
from casetrail.adapters.bus.fastpath import ConfirmedChannel
from casetrail.adapters.bus.properties import Properties
from casetrail.config import Settings
from casetrail.consumers.writer import _INSERT_AND_FOLD
from casetrail.contract.events import Event, event_payload_json, new_case_id

PREFETCH, BATCH = 2000, 500
"""The consumer's defaults (``CASETRAIL_CONSUMER_PREFETCH``, ``_BATCH_SIZE``)."""

CYCLES_A_CASE = 10
CASES_AT_ONCE = 64
"""Cases whose events interleave in a batch, as concurrent cases' do."""


def _rounds(values: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of each figure over rounds."""
    return {key: (round(statistics.median(v[key] for v in values), 3)
                  if isinstance(values[0][key], float | int) else values[0][key])
            for key in values[0]}


# --- the broker ----------------------------------------------------------------------

async def broker_share(url: str, kind: str, count: int, in_flight: int) -> dict[str, Any]:
    """``count`` events published (confirmed, persistent, ``in_flight`` unconfirmed at
    most) into a fresh queue of ``kind`` (``quorum`` or ``stream``) while a consumer
    takes them as the event-log consumer does (prefetch 2,000, one multiple ack a batch
    of 500, or what has arrived when nothing more is coming)."""
    bodies = [e.to_json() for e in sample_cycles(count)]
    queue = f"casetrail-bench-durable-{kind}-{uuid.uuid4().hex[:6]}"
    first = url.split(",", maxsplit=1)[0]
    connection = await aiormq.connect(first)
    consuming_connection = await aiormq.connect(first)
    try:
        channel = await connection.channel(publisher_confirms=True)
        await channel.queue_declare(queue, durable=True, arguments={"x-queue-type": kind})
        reader = await consuming_connection.channel()
        await reader.basic_qos(prefetch_count=PREFETCH)
        consumed = 0
        done = asyncio.Event()

        async def on_message(message: aiormq.abc.DeliveredMessage) -> None:
            nonlocal consumed
            consumed += 1
            if consumed % min(BATCH, in_flight) == 0 or consumed == count:
                await reader.basic_ack(message.delivery_tag or 0, multiple=True)
            if consumed == count:
                done.set()

        # A stream is read from an offset (here its first message); a queue hands out
        # what it holds.
        arguments: dict[str, Any] = {"x-stream-offset": "first"} if kind == "stream" else {}
        await reader.basic_consume(queue, on_message, arguments=arguments)
        confirmed = ConfirmedChannel(channel)
        gate = asyncio.Semaphore(in_flight)

        async def one(i: int, body: bytes) -> None:
            async with gate:
                await confirmed.publish("", queue, body, Properties(message_id=str(i)))

        before = service_cpu()["rabbitmq"]
        started = time.perf_counter()
        await asyncio.gather(*(one(i, b) for i, b in enumerate(bodies)))
        await asyncio.wait_for(done.wait(), 600)
        elapsed = time.perf_counter() - started
        broker = service_cpu()["rabbitmq"] - before
        await channel.queue_delete(queue)
    finally:
        await consuming_connection.close()
        await connection.close()
    return {"queue": kind, "inFlight": in_flight, "events": count,
            "bodyBytes": len(bodies[0]),
            "eventsPerSecond": round(count / elapsed),
            "brokerCpuMicroseconds": round(broker / count * 1e6, 1)}


async def broker(count: int, rounds: int = 3) -> list[dict[str, Any]]:
    from faults import cluster

    async def shapes(bus: str, url: str) -> list[dict[str, Any]]:
        rows = []
        for in_flight in (1000, 64):
            for kind in ("quorum", "stream"):
                runs = [await broker_share(url, kind, count, in_flight)
                        for _ in range(rounds)]
                rows.append({"bus": bus, **_rounds(runs)})
                print(rows[-1], [r["brokerCpuMicroseconds"] for r in runs], flush=True)
        return rows

    rows = await shapes("single node", "amqp://guest:guest@127.0.0.1:5672/")
    await asyncio.to_thread(cluster.start)
    try:
        rows += await shapes("3-node cluster", cluster.urls())
    finally:
        await asyncio.to_thread(cluster.stop)
    return rows


# --- Postgres -----------------------------------------------------------------------

def _columns(events: list[Event]) -> tuple[list[Any], ...]:
    """The consumer's statement's arguments for ``events``, signed-shaped: the body is
    the event's canonical bytes, the hashes and signature of real length."""
    def digest(e: Event, salt: bytes) -> str:
        return hashlib.sha256(salt + e.event_id.bytes).hexdigest()

    return (
        [e.event_id for e in events], [e.case_id for e in events],
        [e.attempt for e in events], [e.seq for e in events],
        [e.event_type for e in events], [e.occurred_at for e in events],
        [2 for _ in events], [event_payload_json(e).decode() for e in events],
        [e.tenant_id for e in events], [digest(e, b"prev") for e in events],
        [digest(e, b"hash") for e in events], ["0123456789abcdef" for _ in events],
        [base64.b64encode(os.urandom(64)).decode() for _ in events],
        [e.to_json() for e in events],
    )


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
_FROM_STAGING = (
    "WITH locked AS MATERIALIZED (SELECT case_id FROM cases WHERE case_id IN "
    "(SELECT case_id FROM incoming) ORDER BY case_id FOR UPDATE), inserted AS"
    + _INSERT_AND_FOLD.split("inserted AS", 1)[1])


async def _cases_for(conn: asyncpg.Connection, batches: list[tuple[list[Any], ...]]) -> None:
    ids = sorted({c for batch in batches for c in batch[1]})
    await conn.execute(
        "INSERT INTO cases (case_id, agent, status, input, model, limits, request_digest) "
        "SELECT id, 'bench', 'running', '{}', '{}', '{}', 'bench' FROM unnest($1::uuid[]) id",
        ids)


Write = Callable[[asyncpg.Connection, tuple[list[Any], ...]], Awaitable[None]]


async def _with_arrays(conn: asyncpg.Connection, batch: tuple[list[Any], ...]) -> None:
    await conn.fetch(_INSERT_AND_FOLD, *batch)


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
    "COPY into staging": [],
    "as today, batches of 20": [],
}
SMALL_BATCH = 20
"""About what the consumer takes at a time in the end-to-end run (2,000 events/s, 5 ms
of linger)."""


def _renamed(batches: list[tuple[list[Any], ...]]) -> list[tuple[list[Any], ...]]:
    """``batches`` as other cases' events: new case ids (UUIDv7, this month) and event
    ids, the rest as it was; much cheaper than making events again."""
    cases: dict[uuid.UUID, uuid.UUID] = {}
    return [(
        [uuid.uuid4() for _ in batch[0]],
        [cases.setdefault(c, new_case_id()) for c in batch[1]],
        *batch[2:],
    ) for batch in batches]


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
        rows.append(_rounds(runs))
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


# --- the worker ---------------------------------------------------------------------

async def worker(cases: int = 1000, rounds: int = 3) -> list[dict[str, Any]]:
    from bench import models

    rows = []
    for label, loop, workers in (("uvloop, one worker", "uvloop", 1),
                                 ("asyncio, one worker", "asyncio", 1),
                                 ("uvloop, two workers of 128", "uvloop", 2)):
        runs = [await models.run_cases("openai", cases, 256, event_loop=loop,
                                       workers=workers) for _ in range(rounds)]
        rows.append({"shape": label, **_rounds(runs)})
    return rows


async def measure(scale: float, rounds: int) -> dict[str, Any]:
    """Every experiment, for ``make bench``."""
    return {
        "broker": await broker(int(20_000 * scale), rounds),
        "postgres": await postgres(int(100_000 * scale), rounds,
                                   prefill=int(1_000_000 * scale)),
        "postgresByRole": await postgres_in_the_case_path(int(1000 * scale)),
        "worker": await worker(int(1000 * scale), rounds),
    }


def rows(r: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """``make bench``'s rows of the experiments."""
    x = r.get("durable")
    if not x:
        return []
    out = [(f"bus share, {b['queue']}, {b['bus']}, {b['inFlight']:,} in flight",
            f"{b['brokerCpuMicroseconds']:,.0f} µs", "",
            f"broker CPU an event, published confirmed and consumed; {b['eventsPerSecond']:,}"
            f" events/s; {b['bodyBytes']} B bodies") for b in x["broker"]]
    out += [(f"Postgres share, {p['variant']}", f"{p['postgresCpuMicroseconds']:,.0f} µs", "",
             f"Postgres CPU an event of the consumer's statement; {p['eventsPerSecond']:,} "
             f"events/s; {p['bytesPerEvent']:,} B an event on disk") for p in x["postgres"]]
    roles = x["postgresByRole"]["postgresCpuMicrosecondsByRole"]
    out.append(("Postgres share in the case path, by component",
                f"{sum(roles.values()):,.0f} µs", "", "a cycle, end to end: " + ", ".join(
                    f"{who} {v:,.0f}" for who, v in roles.items())))
    out += [(f"worker share at 256, {w['shape']}", f"{w['shareOfIdeal']:.0%}", "",
             f"openai provider, 300 ms model; {w['turnsPerSecond']:,.0f} turns/s; worker "
             f"{w['workerCpuSeconds'] / max(w['turns'], 1) * 1e6:,.0f} CPU-µs a turn")
            for w in x["worker"]]
    return out


async def main(args: list[str]) -> None:
    numbers = [int(a) for a in args if a.isdigit()]
    parts = [a for a in args if not a.isdigit()] or ["broker", "postgres", "worker"]
    if "broker" in parts:
        await broker(numbers[0] if numbers else 30_000)
    if "attribution" in parts:
        print(await postgres_in_the_case_path(numbers[0] if numbers else 1000), flush=True)
    if "postgres" in parts:
        for row in await postgres(numbers[0] if numbers else 100_000):
            print(row, flush=True)
    if "worker" in parts:
        for row in await worker(numbers[0] if numbers else 1000):
            print(row, flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
