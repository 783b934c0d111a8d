"""Each fault injected while the real stack works, then every event accounted for.

Run with ``make test-faults``; the checker's table prints at the end of the run and
is written to ``faults/last-run.md``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from typing import Any

import aio_pika
import asyncpg
import httpx
import orjson

from bench.harness import unacked
from casetrail.adapters.bus.connection import connect
from casetrail.adapters.bus.dead_letter import REASON_HEADER
from casetrail.adapters.bus.publisher import Publisher, event_emitter
from casetrail.adapters.bus.topology import Topology
from casetrail.adapters.store import ApiKeyStore
from casetrail.agents.loan_officer import SAMPLE_APPLICATIONS
from casetrail.contract.events import make_event, seal_chain
from casetrail.contract.integrity import canonical
from casetrail.trail.keyfile import worker_signer
from faults.checker import check, drain_witness
from faults.conftest import REPORTS, Stack, pg_cluster, rabbit
from tests.support.events import cycle, started
from tests.support.helpers import wait_until

# Settled: ended, or waiting for a person (a refer parks, accounted for by the checker).
TERMINAL = ("completed", "failed", "timed_out", "cancelled", "awaiting_review")


async def submit(stack: Stack, count: int, latency_ms: int = 300) -> set[uuid.UUID]:
    accepted: set[uuid.UUID] = set()
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=30,
                                 headers=stack.headers) as client:
        for i in range(count):
            reply = await client.post("/cases", json={
                "agent": "loan-officer", "input": SAMPLE_APPLICATIONS[i % 3],
                "model": {"provider": "scripted", "name": "slow", "latencyMs": latency_ms}})
            assert reply.status_code == 202, reply.text
            accepted.add(uuid.UUID(reply.json()["caseId"]))
    return accepted


async def all_ended(pool: asyncpg.Pool, cases: set[uuid.UUID], timeout: float = 180) -> None:
    async def ended() -> bool:
        try:
            n = await pool.fetchval("SELECT count(*) FROM cases WHERE case_id = ANY($1::uuid[]) "
                                    "AND status = ANY($2::text[])", list(cases), list(TERMINAL))
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            return False
        return bool(n == len(cases))

    try:
        await wait_until(ended, timeout=timeout, interval=0.3)
    except AssertionError:
        left = await pool.fetch(
            "SELECT status, count(*) AS n FROM cases WHERE case_id = ANY($1::uuid[]) "
            "AND NOT status = ANY($2::text[]) GROUP BY status", list(cases), list(TERMINAL))
        raise AssertionError(f"{sum(r['n'] for r in left)} of {len(cases)} cases had not "
                             f"ended after {timeout} s: "
                             + ", ".join(f"{r['n']} {r['status']}" for r in left)) from None


async def settle_and_check(stack: Stack, pool: asyncpg.Pool, fault: str,
                           accepted: set[uuid.UUID],
                           cases: set[uuid.UUID] | None = None,
                           count_tool_runs: bool = True) -> None:
    """Account for every event; ``count_tool_runs`` when the capability worker lived
    through the fault (its count of handler runs is then the whole run's)."""
    await asyncio.sleep(1.0)  # the consumer's last batch commits
    connection = await connect(stack.settings.amqp_url, "casetrail-faults")
    witness = await drain_witness(connection, Topology(stack.settings.namespace))
    await connection.close()
    report = await check(fault, pool, witness, accepted, cases,
                         tool_runs=await stack.tool_runs() if count_tool_runs else None)
    REPORTS.append(report)
    assert report.clean, report
    assert set(stack.alive()) == set(stack.children), f"a component died: {stack.alive()}"


async def test_broker_restart_while_50_cases_run(stack: Stack, pool: asyncpg.Pool) -> None:
    accepted = await submit(stack, 50)
    await asyncio.sleep(1.0)
    await asyncio.to_thread(rabbit, "stop_app")
    try:
        # What cannot be promised is refused: 503, and no case row left waiting.
        async with httpx.AsyncClient(base_url=stack.base_url, timeout=30,
                                 headers=stack.headers) as client:
            reply = await client.post("/cases", json={"agent": "loan-officer",
                                                      "input": SAMPLE_APPLICATIONS[0]})
        assert reply.status_code == 503, reply.text
        assert await pool.fetchval("SELECT count(*) FROM cases") == len(accepted)
        await asyncio.sleep(1)
    finally:
        await asyncio.to_thread(rabbit, "start_app")
    await all_ended(pool, accepted)
    await wait_until(stack.ready, timeout=60)
    await settle_and_check(stack, pool, "broker restart, 50 cases", accepted)


async def test_setup_waits_for_a_broker_that_is_starting(stack: Stack, pool: asyncpg.Pool
                                                        ) -> None:
    """`make demo` right after the broker (re)started used to fail: setup's import of the
    broker definitions needs the 'rabbit' app running. It waits for it now."""
    await asyncio.to_thread(rabbit, "stop_app")
    try:
        setting_up = asyncio.create_task(asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "casetrail.cli", "setup"],
            capture_output=True, text=True, env=stack.settings.environment(), timeout=180))
        await asyncio.sleep(5)
        assert not setting_up.done(), "setup did not wait for the broker"
    finally:
        await asyncio.to_thread(rabbit, "start_app")
    done = await asyncio.wait_for(setting_up, 150)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "waiting for RabbitMQ at" in done.stderr  # it said what it waited for
    await wait_until(stack.ready, timeout=60)
    accepted = await submit(stack, 5)
    await all_ended(pool, accepted)
    await settle_and_check(stack, pool, "setup beside a starting broker", accepted)


async def test_postgres_down_for_10s_while_ingesting(stack: Stack, pool: asyncpg.Pool) -> None:
    accepted = await submit(stack, 30, latency_ms=200)
    await asyncio.sleep(0.5)
    await asyncio.to_thread(pg_cluster, "stop")
    try:
        await wait_until(lambda: _not(stack.ready), timeout=15)
        async with httpx.AsyncClient(base_url=stack.base_url, timeout=30,
                                 headers=stack.headers) as client:
            reply = await client.post("/cases", json={"agent": "loan-officer",
                                                      "input": SAMPLE_APPLICATIONS[0]})
        assert reply.status_code == 503
        await asyncio.sleep(10)
    finally:
        await asyncio.to_thread(pg_cluster, "start")
    await wait_until(stack.ready, timeout=60)
    await all_ended(pool, accepted)
    await settle_and_check(stack, pool, "postgres down 10 s", accepted)


async def _not(check: Any) -> bool:
    return not await check()


async def test_consumer_killed_mid_batch(stack: Stack, pool: asyncpg.Pool) -> None:
    stack.kill("consumer")
    # Signed events as the worker publishes them (the consumer takes no one else's).
    connection = await aio_pika.connect_robust(stack.settings.identity("worker").amqp_url)
    sink = event_emitter(await Publisher.open(connection), Topology(stack.settings.namespace),
                         worker_signer(stack.settings))
    cases = [uuid.uuid4() for _ in range(100)]
    gate = asyncio.Semaphore(500)

    async def emit(event: Any) -> None:
        async with gate:
            await sink.emit(event)

    await asyncio.gather(*(emit(e) for c in cases for e in
                           [started(c), *(cycle(c, s, s - 1) for s in range(1, 100))]))
    await connection.close()
    stack.start("consumer", "consumer")

    async def some_stored() -> bool:
        return bool(await pool.fetchval("SELECT count(*) > 1500 FROM event_log"))

    await wait_until(some_stored, timeout=60, interval=0.01)
    os.kill(stack.children["consumer"].pid, signal.SIGKILL)
    stack.children["consumer"].wait()
    stack.start("consumer", "consumer")

    async def all_stored() -> bool:
        return bool(await pool.fetchval("SELECT count(*) = 10000 FROM event_log"))

    await wait_until(all_stored, timeout=120)
    await settle_and_check(stack, pool, "consumer kill -9 mid-batch", set(), set(cases))


async def test_one_of_two_consumers_killed_while_cases_run(stack: Stack,
                                                           pool: asyncpg.Pool) -> None:
    # Two consumers share the queue, so one case's events are folded into its row
    # by both; one of them dies mid-stream and comes back.
    stack.start("consumer-2", "consumer")
    accepted = await submit(stack, 40, latency_ms=100)
    await asyncio.sleep(1.0)
    stack.kill("consumer")
    await all_ended(pool, accepted)
    stack.start("consumer", "consumer")
    await settle_and_check(stack, pool, "one of two consumers kill -9", accepted)
    # Each case row counts each of its cycles once, whichever consumer folded it.
    mismatched = await pool.fetch(
        "SELECT c.case_id FROM cases c WHERE c.case_id = ANY($1::uuid[]) AND c.cycles <> "
        "(SELECT count(*) FROM event_log e WHERE e.case_id = c.case_id "
        "AND e.event_type = 'REACT_CYCLE')", list(accepted))
    assert mismatched == []


async def test_worker_killed_mid_case(stack: Stack, pool: asyncpg.Pool) -> None:
    accepted = await submit(stack, 20, latency_ms=400)
    await asyncio.sleep(1.2)
    stack.kill("worker")
    stack.start("worker", "worker")
    await all_ended(pool, accepted)
    await settle_and_check(stack, pool, "worker kill -9 mid-case", accepted)
    attempts = await pool.fetch("SELECT case_id, max(attempt) AS attempts FROM event_log "
                                "WHERE case_id = ANY($1::uuid[]) GROUP BY case_id",
                                list(accepted))
    assert any(r["attempts"] >= 2 for r in attempts), "no case needed a second attempt"
    resumed = await pool.fetchval(
        "SELECT count(*) FROM event_log WHERE case_id = ANY($1::uuid[]) AND event_type = "
        "'CASE_STARTED' AND payload ? 'resumedFrom'", list(accepted))
    assert resumed >= 1, "no second attempt resumed from the record"


async def test_capability_worker_killed_mid_call(stack: Stack, pool: asyncpg.Pool) -> None:
    accepted = await submit(stack, 40, latency_ms=50)
    await asyncio.sleep(0.3)
    stack.kill("capability-worker")
    await asyncio.sleep(1.0)
    stack.start("capability-worker", "capability-worker")
    await all_ended(pool, accepted)
    await settle_and_check(stack, pool, "capability worker kill -9", accepted,
                           count_tool_runs=False)
    calls = await pool.fetch(
        "SELECT tool_result, error, attempt_count FROM react_tool_calls WHERE case_id = "
        "ANY($1::uuid[]) AND tool_source = 'worker'", list(accepted))
    # Every worker call ended in a result or a stated error, never an invented value.
    assert calls and all((c["tool_result"] is None) == (c["error"] is not None) for c in calls)


async def test_poison_on_the_bus(stack: Stack, pool: asyncpg.Pool) -> None:
    connection = await aio_pika.connect_robust(stack.settings.identity("worker").amqp_url)
    topology = Topology(stack.settings.namespace)
    publisher = await Publisher.open(connection)
    signer = worker_signer(stack.settings)
    sink = event_emitter(publisher, topology, signer)
    case_id = uuid.uuid4()
    good = [started(case_id), cycle(case_id, 1, 0), cycle(case_id, 2, 1)]
    valid = orjson.loads(good[1].to_json())
    conflict = orjson.loads(good[1].to_json())
    conflict["payload"]["reasoningText"] = "rewritten history"
    poison = [
        (b"{not json", "not valid JSON"),
        (orjson.dumps({**valid, "schemaVersion": 7}), "schemaVersion"),
        (orjson.dumps({k: v for k, v in valid.items() if k != "payload"}), "payload"),
        (b'{"x": "' + b"y" * 10_000_000 + b'"}', "byte limit"),
    ]
    key = f"case.default.{case_id}.REACT_CYCLE"
    for event, (body, _) in zip(good, poison, strict=False):
        await sink.emit(event)
        await publisher.publish(topology.events_exchange, key, body)
    await publisher.publish(topology.events_exchange, key, poison[-1][0])
    await wait_until(lambda: _rows(pool, case_id, 3), timeout=30)
    # Other content for a stored (case, attempt, seq), signed with the worker's key.
    body = canonical(conflict)
    await sink.out.publish_sealed(good[1], body, signer.seal(
        seal_chain(good, signer)[0].integrity.hash, body))
    await sink.emit(make_event(case_id, 1, 3, good[2].payload))
    await wait_until(lambda: _rows(pool, case_id, 4), timeout=30)
    await connection.close()
    # What was set aside, read as the operator (no component may read dead letters).
    connection = await aio_pika.connect_robust(stack.settings.amqp_url)
    channel = await connection.channel()
    dead = await channel.get_queue(topology.dead_letter_queue, ensure=False)
    reasons: list[str] = []
    for _ in range(200):
        message = await dead.get(no_ack=True, fail=False)
        if message is None:
            if len(reasons) >= len(poison) + 1:
                break
            await asyncio.sleep(0.05)
            continue
        reasons.append(str((message.headers or {}).get(REASON_HEADER)))
    await connection.close()
    for _, expected in poison:
        assert any(expected in r for r in reasons), (expected, reasons)
    assert any("conflict" in r for r in reasons)
    await settle_and_check(stack, pool, "poison on the bus", set(), {case_id})


async def _rows(pool: asyncpg.Pool, case_id: uuid.UUID, n: int) -> bool:
    return bool(await pool.fetchval("SELECT count(*) >= $2 FROM event_log WHERE case_id = $1",
                                    case_id, n))


async def test_parked_cases_survive_a_worker_kill_and_a_broker_restart(
    stack: Stack, pool: asyncpg.Pool,
) -> None:
    """Referred cases wait for a person holding nothing: a kill -9 of the worker and a
    broker restart while they wait lose none, leave no unacked message, and each
    completes after its review with the reviewer on the record."""
    referred = SAMPLE_APPLICATIONS[1]  # the scripted loan officer refers it: it parks
    accepted: set[uuid.UUID] = set()
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=30,
                                 headers=stack.headers) as client:
        for _ in range(20):
            reply = await client.post("/cases", json={"agent": "loan-officer",
                                                      "input": referred})
            assert reply.status_code == 202, reply.text
            accepted.add(uuid.UUID(reply.json()["caseId"]))
    await all_ended(pool, accepted)
    assert await pool.fetchval("SELECT count(*) FROM cases WHERE case_id = ANY($1::uuid[]) "
                               "AND status = 'awaiting_review'", list(accepted)) == 20
    stack.kill("worker")
    await asyncio.to_thread(rabbit, "stop_app")
    await asyncio.to_thread(rabbit, "start_app")
    stack.start("worker", "worker")
    await wait_until(stack.ready, timeout=60)
    assert await asyncio.to_thread(unacked, stack.settings.namespace) == 0
    _, secret = await ApiKeyStore(pool).create("default", ("cases:review", "cases:read"),
                                               "faults reviewer", None, "faults-rita")
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=30, headers={
            "Authorization": f"Bearer {secret}"}) as reviewer:
        for case_id in accepted:
            reply = await reviewer.post(f"/cases/{case_id}/review", json={
                "verdict": "confirm", "reason": "Income verified by phone."})
            assert reply.status_code == 202, reply.text

    async def reviewed() -> bool:
        return bool(await pool.fetchval(
            "SELECT count(*) = $2 FROM cases WHERE case_id = ANY($1::uuid[]) AND status = "
            "'completed'", list(accepted), len(accepted)))

    await wait_until(reviewed, timeout=120, interval=0.3)
    await settle_and_check(stack, pool, "parked: worker kill -9 + broker restart", accepted)
    rows = await pool.fetch("SELECT reviewer AS who, verdict FROM case_reviews "
                            "WHERE case_id = ANY($1::uuid[])", list(accepted))
    assert len(rows) == 20 and {(r["who"], r["verdict"]) for r in rows} == {
        ("faults-rita", "confirm")}

