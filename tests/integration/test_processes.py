"""The real processes (``casetrail api``, ``worker``, ``consumer``, ``capability-worker``,
``demo``, ``trail``) against the real RabbitMQ and Postgres, as they run in production."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg
import httpx
import orjson
import pytest

from casetrail.agents.loan_officer import SAMPLE_APPLICATIONS
from casetrail.config import Settings
from casetrail.ops.setup import remove
from casetrail.trail.keyfile import worker_signer
from tests.support.fixtures import TESTS_APPLICATION
from tests.support.helpers import ended, wait_for_sql, wait_until
from tests.support.stack import api_ready, free_port, other_namespace, spawn, stop_cleanly


def test_a_component_started_with_the_environment_reads_the_same_settings(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in settings.environment(CASETRAIL_API_PORT="9123").items():
        monkeypatch.setenv(name, value)
    assert Settings() == settings.model_copy(update={"api_port": 9123})
    assert Settings().consumer_linger_ms == 2.0 != Settings.model_fields[
        "consumer_linger_ms"].default  # a test setting, not the default, reached the child


@pytest.fixture(scope="module")
async def processes(
    settings: Settings, database: str, amqp: aio_pika.abc.AbstractRobustConnection,
    auth_headers: dict[str, str],
) -> AsyncIterator[dict[str, Any]]:
    port = free_port()
    children = {
        "api": spawn(settings, "api", "--port", str(port)),
        "worker": spawn(settings, "worker"),
        "consumer": spawn(settings, "consumer"),
        "capability-worker": spawn(settings, "capability-worker"),
    }
    base_url = f"http://127.0.0.1:{port}"
    await wait_until(lambda: api_ready(base_url), timeout=30, interval=0.2)
    yield {"base_url": base_url, "children": children, "headers": auth_headers}
    await stop_cleanly(children)


async def test_no_component_connects_as_a_superuser_or_the_owner(
    processes: dict[str, Any], pool: asyncpg.Pool, settings: Settings,
) -> None:
    """While the real processes run, every session on the test database but the tests'
    own belongs to a component's login role: none is a superuser, none is the owner."""
    async with httpx.AsyncClient(base_url=processes["base_url"],
                                 headers=processes["headers"]) as client:
        await post_slow_case(client, SAMPLE_APPLICATIONS[0], latency_ms=0)
    expected = {(f"casetrail-{c}", settings.database_role(c)) for c in ("api", "worker",
                                                                       "consumer")}

    async def everyone_connected() -> list[asyncpg.Record] | None:
        # The API answers before the worker and the consumer, slower to start, connect.
        rows = await pool.fetch(
            """SELECT a.application_name, a.usename, r.rolsuper
               FROM pg_stat_activity a JOIN pg_roles r ON r.oid = a.usesysid
               WHERE a.datname = current_database() AND a.application_name <> $1""",
            TESTS_APPLICATION)
        seen = {(row["application_name"], row["usename"]) for row in rows}
        return rows if expected <= seen else None

    sessions = await wait_until(everyone_connected, timeout=30, interval=0.2)
    assert not [row for row in sessions if row["rolsuper"]], sessions
    assert settings.database_role("owner") not in {row["usename"] for row in sessions}
    owner = await pool.fetchval(
        "SELECT rolcanlogin FROM pg_roles WHERE rolname = $1", settings.database_role("owner"))
    assert owner is False  # NOLOGIN: it owns the schema and is used only by migrate


async def post_slow_case(client: httpx.AsyncClient, application: dict[str, Any],
                         latency_ms: int) -> uuid.UUID:
    """A loan case whose scripted model takes ``latency_ms`` a turn; its id."""
    reply = await client.post("/cases", json={
        "agent": "loan-officer", "input": application,
        "model": {"provider": "scripted", "name": "slow", "latencyMs": latency_ms}})
    return uuid.UUID(reply.json()["caseId"])


async def test_the_seed_integration_test_done_for_real(
    processes: dict[str, Any], pool: asyncpg.Pool, amqp: aio_pika.abc.AbstractRobustConnection,
    settings: Settings,
) -> None:
    channel = await amqp.channel()
    exchange = await channel.get_exchange(f"{settings.namespace}.events", ensure=False)
    subscriber = await channel.declare_queue(exclusive=True, auto_delete=True)
    await subscriber.bind(exchange, routing_key="case.*.*.REACT_CYCLE")
    async with httpx.AsyncClient(base_url=processes["base_url"],
                                 headers=processes["headers"]) as client:
        reply = await client.post("/cases", json={"agent": "loan-officer",
                                                  "input": SAMPLE_APPLICATIONS[2]})
        assert reply.status_code == 202
        case_id = uuid.UUID(reply.json()["caseId"])

        case = await ended(client, case_id, timeout=30)
    assert case["answer"]["decision"] == "decline"

    rows = await pool.fetch(
        "SELECT attempt, seq, event_type, payload FROM event_log WHERE case_id = $1 "
        "ORDER BY attempt, seq", case_id)
    assert [r["seq"] for r in rows] == list(range(len(rows)))
    types = [r["event_type"] for r in rows]
    assert types[0] == "CASE_STARTED" and types[-1] == "CASE_COMPLETED"
    assert sum(t in ("CASE_COMPLETED", "CASE_FAILED", "CASE_TIMED_OUT", "CASE_CANCELLED")
               for t in types) == 1
    cycles = [r["payload"] for r in rows if r["event_type"] == "REACT_CYCLE"]
    assert all({"cycleIndex", "reasoningText", "toolCalls", "tokenUsage"} <= set(c)
               for c in cycles)
    calls = [call for c in cycles for call in c["toolCalls"]]
    assert {c["toolSource"] for c in calls} == {"worker", "local"}
    assert all(isinstance(c["durationMs"], int) for c in calls)
    assert all({"toolName", "toolArgs", "toolResult", "toolSource", "durationMs"} <= set(c)
               for c in calls)
    status = await pool.fetchval("SELECT status FROM cases WHERE case_id = $1", case_id)
    assert status == "completed"

    heard: list[dict[str, Any]] = []
    while len(heard) < len(cycles):
        message = await subscriber.get(timeout=5, fail=False, no_ack=True)
        assert message is not None
        event = orjson.loads(message.body)
        if event["caseId"] == str(case_id):
            heard.append(event["payload"])
    assert heard == cycles
    await channel.close()

    shown = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "casetrail.cli", "trail", str(case_id)],
        env=settings.environment(), capture_output=True, text=True, timeout=30, check=True,
    )
    printed = shown.stdout
    assert "REACT_CYCLE cycle 1 " in printed and "credit-score" in printed  # from 1
    assert "[worker," in printed and "[local," in printed and "decline" in printed


async def test_a_killed_worker_leads_to_a_second_attempt(
    processes: dict[str, Any], pool: asyncpg.Pool, settings: Settings
) -> None:
    worker: subprocess.Popen[bytes] = processes["children"]["worker"]
    async with httpx.AsyncClient(base_url=processes["base_url"],
                                 headers=processes["headers"]) as client:
        case_id = await post_slow_case(client, SAMPLE_APPLICATIONS[0], latency_ms=700)

        await wait_for_sql(pool, "SELECT count(*) FROM event_log WHERE case_id = $1 AND "
                           "event_type = 'REACT_CYCLE'", case_id, timeout=20)
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()
        processes["children"]["worker"] = spawn(settings, "worker")

        case = await ended(client, case_id, timeout=60)
    assert case["status"] == "completed" and case["attempts"] == 2
    rows = await pool.fetch(
        "SELECT attempt, seq, event_type, payload FROM event_log WHERE case_id = $1 "
        "ORDER BY attempt, seq", case_id)
    by_attempt: dict[int, list[str]] = {}
    for row in rows:
        by_attempt.setdefault(row["attempt"], []).append(row["event_type"])
    assert set(by_attempt) == {1, 2}
    assert by_attempt[1][0] == "CASE_STARTED" and "CASE_COMPLETED" not in by_attempt[1]
    # Attempt 2 took up the case after attempt 1's recorded cycles (tests/integration/test_resume.py
    # counts the model requests and tool executions of this).
    recorded = by_attempt[1].count("REACT_CYCLE")
    assert recorded >= 1
    assert by_attempt[2] == ["CASE_STARTED"] + ["REACT_CYCLE"] * (4 - recorded) \
        + ["CASE_COMPLETED"]
    for attempt in (1, 2):
        seqs = [r["seq"] for r in rows if r["attempt"] == attempt]
        assert seqs == list(range(len(seqs)))
    restarted = next(r for r in rows if r["attempt"] == 2)["payload"]
    assert "attempt 1" in restarted["restartReason"]
    assert restarted["resumedFrom"]["cycles"] == recorded
    assert [r["payload"]["cycleIndex"] for r in rows if r["event_type"] == "REACT_CYCLE"] \
        == [0, 1, 2, 3]


async def test_the_demo_runs_end_to_end(settings: Settings, database: str) -> None:
    demo = other_namespace(settings, "demo")
    try:
        result = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "casetrail.cli", "demo", "--port", str(free_port())],
            env=demo.environment(), capture_output=True, text=True, timeout=120,
        )
    finally:
        await remove(demo)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    assert "-- live from the bus" in out and "-- the persisted trail, from Postgres --" in out
    assert "The credit score is 742. I should now retrieve the risk model" in out
    for name, decision in [("Maria Okafor", "approve"), ("Daniel Reyes", "refer"),
                           ("Priya Nair", "decline")]:
        assert any(name in line and decision in line and "completed" in line
                   for line in out.splitlines()), (name, decision)
    # The refer waited for a person; the demo's reviewer confirmed it, on the record.
    assert "CASE_AWAITING_REVIEW" in out and "CASE_REVIEWED  confirm by demo-reviewer" in out
    assert "answer (decided by the reviewer)" in out
    # Each case's viewer page: one link per case started.
    started = re.findall(r"-> 202 caseId=([0-9a-f-]{36})", out)
    linked = re.findall(r"http://127\.0\.0\.1:\d+/ui/cases/([0-9a-f-]{36})", out)
    assert len(started) == 4 and linked == started


async def test_up_runs_the_stack_and_sigterm_stops_every_child(settings: Settings,
                                                                database: str) -> None:
    port = free_port()
    stack = other_namespace(settings, "up")
    env = stack.environment()
    up = subprocess.Popen(  # noqa: ASYNC220 - a child that outlives this call, on purpose
        [sys.executable, "-m", "casetrail.cli", "up", "--port", str(port)], env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        async def ready() -> bool:
            try:
                async with httpx.AsyncClient() as client:
                    reply = await client.get(f"http://127.0.0.1:{port}/readyz")
                    return reply.status_code == 200
            except httpx.TransportError:
                return False

        await wait_until(ready, timeout=40, interval=0.2)
        children = [int(p) for p in (await asyncio.to_thread(
            subprocess.run, ["pgrep", "-P", str(up.pid)], capture_output=True, text=True,
            check=False)).stdout.split()]
        assert len(children) == 6  # api, worker, consumer, ledger, capability worker, auditor
        up.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(up.wait, 30) == 0
        for pid in children:
            assert not Path(f"/proc/{pid}").exists() or \
                "zombie" in Path(f"/proc/{pid}/status").read_text().lower()  # noqa: ASYNC240
    finally:
        if up.poll() is None:
            up.kill()
        await remove(stack)


async def test_tail_prints_live_events_filtered_by_type(
    settings: Settings, worker_amqp: aio_pika.abc.AbstractRobustConnection
) -> None:
    from casetrail.adapters.bus.publisher import Publisher, event_emitter
    from casetrail.adapters.bus.topology import Topology
    from tests.support.events import completed, cycle, started

    case_id = uuid.uuid4()
    tail = subprocess.Popen(  # noqa: ASYNC220 - runs beside the test until it is stopped
        [sys.executable, "-m", "casetrail.cli", "tail", "--types", "REACT_CYCLE", "--json"],
        env=settings.environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert tail.stderr is not None and tail.stdout is not None
        banner = await asyncio.to_thread(tail.stderr.readline)
        assert b"tailing" in banner
        sink = event_emitter(await Publisher.open(worker_amqp), Topology(settings.namespace),
                             worker_signer(settings))
        for event in (started(case_id), cycle(case_id, 1, 0), completed(case_id, 2)):
            await sink.emit(event)
        line = await asyncio.wait_for(asyncio.to_thread(tail.stdout.readline), 10)
        shown = orjson.loads(line)
        assert shown["caseId"] == str(case_id) and shown["eventType"] == "REACT_CYCLE"
    finally:
        tail.send_signal(signal.SIGINT)
        await asyncio.to_thread(tail.wait, 10)
    assert tail.returncode == 0
    rest = tail.stdout.read() if tail.stdout else b""
    assert b"CASE_STARTED" not in rest and b"CASE_COMPLETED" not in rest


async def test_sigterm_lets_the_worker_finish_the_case_it_holds(
    processes: dict[str, Any], pool: asyncpg.Pool, settings: Settings
) -> None:
    worker: subprocess.Popen[bytes] = processes["children"]["worker"]
    async with httpx.AsyncClient(base_url=processes["base_url"],
                                 headers=processes["headers"]) as client:
        case_id = await post_slow_case(client, SAMPLE_APPLICATIONS[1], latency_ms=400)

        await wait_for_sql(pool, "SELECT status = 'running' FROM cases WHERE case_id = $1",
                           case_id, timeout=20)
        worker.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(worker.wait, 30) == 0
        replacement = processes["children"]["worker"] = spawn(settings, "worker")

        case = await ended(client, case_id, timeout=30)
    async def replacement_ready() -> bool:
        log = Path(replacement.log_path).read_text()  # type: ignore[attr-defined]  # noqa: ASYNC240
        return "taking cases" in log

    await wait_until(replacement_ready, timeout=30)
    # The case's attempt ended inside the shutdown grace period: one attempt, its refer
    # waiting for a person (no worker holds it).
    assert case["status"] == "awaiting_review" and case["attempts"] == 1
    assert case["answer"]["decision"] == "refer"


async def test_the_api_keeps_an_idle_connection_longer_than_its_clients_do(
    processes: dict[str, Any],
) -> None:
    """An idle connection outlives the client's own expiry (httpx drops its idle
    connections after 5 s): the API must not be the one to close it, or a request sent
    as it closes fails. Two requests on one socket, 6 s apart."""
    host, port = processes["base_url"].removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    request = f"GET /healthz HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
    try:
        for pause in (0, 6):
            await asyncio.sleep(pause)
            writer.write(request)
            await writer.drain()
            status = await asyncio.wait_for(reader.readline(), 10)
            assert status.startswith(b"HTTP/1.1 200"), (pause, status)
            length = 0
            while (line := await reader.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            await reader.readexactly(length)
    finally:
        writer.close()
