"""Server-Sent Events over real HTTP: a case's stored trail then its live events, with
no gap and no duplicate at the seam, ``Last-Event-ID`` resume, keep-alives, the
tenant stream, and one bus subscription per API process (checked on the broker)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest

from casetrail.adapters.store import ApiKeyStore
from casetrail.agents.loan_officer import SAMPLE_APPLICATIONS
from casetrail.config import Settings
from tests.support.broker import rabbitmqctl_json
from tests.support.helpers import ended, wait_until
from tests.support.records import tamper
from tests.support.stack import InProcessStack, module_stack, serve_api
from tests.support.streams import read_stream

stack = module_stack(worker_concurrency=8)

LOAN = {"agent": "loan-officer", "input": SAMPLE_APPLICATIONS[0]}
LOAN_TYPES = ["CASE_STARTED"] + ["REACT_CYCLE"] * 4 + ["CASE_COMPLETED"]


def slow(latency_ms: int) -> dict[str, Any]:
    return {**LOAN, "model": {"provider": "scripted", "name": "slow", "latencyMs": latency_ms}}






async def stored_count(client: httpx.AsyncClient, case_id: str) -> int:
    return len((await client.get(f"/cases/{case_id}/events")).json()["events"])


async def test_a_case_stream_sends_the_record_then_live_events_and_ends_at_the_terminal(
    client: httpx.AsyncClient,
) -> None:
    case_id = (await client.post("/cases", json=slow(400))).json()["caseId"]
    await wait_until(lambda: stored_count(client, case_id), timeout=10)  # some are stored
    got = await read_stream(client, f"/cases/{case_id}/stream")
    assert [e.event for e in got.events] == LOAN_TYPES
    assert [e.id for e in got.events] == [f"1.{n}" for n in range(6)]
    # Some came from the record (recordedAt set), the rest live (recordedAt null).
    recorded = [e.data["recordedAt"] is not None for e in got.events]
    assert recorded[0] and not recorded[-1], recorded
    # Live or stored, each is the envelope the trail holds, signature included.
    await ended(client, case_id)
    trail = (await client.get(f"/cases/{case_id}/events")).json()["events"]
    for sent, kept in zip(got.events, trail, strict=True):
        assert {k: v for k, v in sent.data.items() if k != "recordedAt"} == \
               {k: v for k, v in kept.items() if k != "recordedAt"}
    assert got.events[-1].data["payload"]["answer"]["decision"] == "approve"


async def test_streams_opened_at_any_moment_of_a_case_all_get_every_event_once(
    client: httpx.AsyncClient,
) -> None:
    """Streams opened every 70 ms across a running case: each must see the whole trail,
    however its seam between record and live feed fell."""
    case_id = (await client.post("/cases", json=slow(250))).json()["caseId"]

    async def late_reader(delay: float) -> list[str | None]:
        await asyncio.sleep(delay)
        return [e.id for e in (await read_stream(client, f"/cases/{case_id}/stream")).events]

    seen = await asyncio.gather(*(late_reader(0.07 * n) for n in range(20)))
    assert all(ids == [f"1.{n}" for n in range(6)] for ids in seen), seen


async def test_a_terminal_event_stored_after_the_stream_began_still_ends_it(
    client: httpx.AsyncClient, pool: asyncpg.Pool,
) -> None:
    """The seam's hardest case: the terminal event was published before the stream's
    watch began and reaches the record only after the stream read it, so no live event
    follows to reveal the gap. Made here by taking the stored event out and putting it
    back while the stream is open (the consumer's lag, stretched)."""
    case_id = (await client.post("/cases", json=LOAN)).json()["caseId"]
    await ended(client, case_id)
    terminal = await pool.fetchrow(
        "SELECT * FROM event_log WHERE case_id = $1 AND event_type = 'CASE_COMPLETED'",
        uuid.UUID(case_id))
    assert terminal is not None
    await tamper(pool, "DELETE FROM event_log WHERE event_id = $1", terminal["event_id"])
    await pool.execute("UPDATE cases SET status = 'running' WHERE case_id = $1",
                       uuid.UUID(case_id))
    reading = asyncio.create_task(read_stream(client, f"/cases/{case_id}/stream"))
    await asyncio.sleep(0.5)  # the stream has sent the record and is waiting live
    assert not reading.done()
    columns = list(terminal.keys())
    await pool.execute(
        f"INSERT INTO event_log ({', '.join(columns)}) VALUES "
        f"({', '.join(f'${n}' for n in range(1, len(columns) + 1))})", *terminal.values())
    got = await asyncio.wait_for(reading, 10)
    assert [e.id for e in got.events] == [f"1.{n}" for n in range(6)]


async def test_last_event_id_resumes_after_that_event(client: httpx.AsyncClient) -> None:
    case_id = (await client.post("/cases", json=LOAN)).json()["caseId"]
    await ended(client, case_id)
    got = await read_stream(client, f"/cases/{case_id}/stream", last_event_id="1.2")
    assert [e.id for e in got.events] == ["1.3", "1.4", "1.5"]
    # Resuming after the terminal event: nothing more, and the stream ends.
    assert (await read_stream(client, f"/cases/{case_id}/stream",
                              last_event_id="1.5")).events == []
    bad = await client.get(f"/cases/{case_id}/stream", headers={"Last-Event-ID": "seven"})
    assert bad.status_code == 422 and "last-event-id" in bad.text


async def test_another_tenants_case_stream_is_a_404_and_its_events_never_reach_us(
    stack: InProcessStack, client: httpx.AsyncClient, pool: asyncpg.Pool,
) -> None:
    _, other_key = await ApiKeyStore(pool).create("globex", ("cases:read", "cases:start",
                                                             "models:override"),
                                                  "other tenant")
    async with httpx.AsyncClient(base_url=stack.base_url,
                                 headers={"Authorization": f"Bearer {other_key}"}) as other:
        ours = (await client.post("/cases", json=slow(200))).json()["caseId"]
        assert (await other.get(f"/cases/{ours}/stream")).status_code == 404
        # globex's dashboard stream, open while our case and one of globex's run:
        # it carries globex's events only.
        dashboard = asyncio.create_task(read_stream(other, "/events/stream", until=6))
        await asyncio.sleep(0.3)
        theirs = (await other.post("/cases", json=slow(100))).json()["caseId"]
        got = await asyncio.wait_for(dashboard, 20)
    assert {e.data["caseId"] for e in got.events} == {theirs}
    assert {e.data["tenantId"] for e in got.events} == {"globex"}
    assert [e.event for e in got.events] == LOAN_TYPES
    assert all(e.id == e.data["eventId"] for e in got.events)
    assert (await client.get("/events/stream", headers={"Authorization": "Bearer nope"})
            ).status_code == 401


def _watch_queues(namespace: str) -> dict[str, int]:
    """The API's stream queues on the broker: name -> number of consumers."""
    return {q["name"]: q["consumers"] for q in rabbitmqctl_json("list_queues", "name", "consumers")
            if q["name"].startswith(f"{namespace}.watch.")}


def _watch_bindings(namespace: str) -> list[str]:
    bindings = rabbitmqctl_json("list_bindings", "source_name", "destination_name", "routing_key")
    return [b["routing_key"] for b in bindings
            if b["destination_name"].startswith(f"{namespace}.watch.")
            and b["source_name"] == f"{namespace}.events"]


async def test_many_streams_share_one_queue_and_one_binding_per_watched_case(
    settings: Settings, client: httpx.AsyncClient,
) -> None:
    cases = [(await client.post("/cases", json=slow(1500))).json()["caseId"] for _ in range(2)]
    readers = [asyncio.create_task(read_stream(client, f"/cases/{cases[n % 2]}/stream"))
               for n in range(30)]
    await asyncio.sleep(0.8)
    queues = await asyncio.to_thread(_watch_queues, settings.namespace)
    bindings = await asyncio.to_thread(_watch_bindings, settings.namespace)
    assert list(queues.values()) == [1], queues  # one queue, one consumer, 30 streams
    assert sorted(bindings) == sorted(f"case.*.{c}.#" for c in cases)
    results = await asyncio.gather(*readers)
    assert all([e.event for e in r.events] == LOAN_TYPES for r in results)

    async def unbound() -> bool:
        return not await asyncio.to_thread(_watch_bindings, settings.namespace)
    await wait_until(unbound, timeout=10)  # nobody watches: nothing reaches the API


@pytest.fixture
async def pinging_api(settings: Settings, stack: InProcessStack) -> AsyncIterator[str]:
    """A second API process on the same stack whose idle streams ping every 0.2 s."""
    async with serve_api(settings.model_copy(update={"stream_ping_seconds": 0.2})) as url:
        yield url


async def test_an_idle_stream_pings_and_ends_when_its_key_is_revoked(
    pinging_api: str, client: httpx.AsyncClient, pool: asyncpg.Pool,
) -> None:
    keys = ApiKeyStore(pool)
    key_id, key = await keys.create("default", ("cases:read",), "watcher")
    case_id = (await client.post("/cases", json=slow(3000))).json()["caseId"]
    await wait_until(lambda: stored_count(client, case_id), timeout=10)  # CASE_STARTED
    async with httpx.AsyncClient(base_url=pinging_api,
                                 headers={"Authorization": f"Bearer {key}"}) as watcher:
        pinged = await read_stream(watcher, f"/cases/{case_id}/stream", comments_until=3)
        assert pinged.comments[:3] == [": ping"] * 3
        assert [e.event for e in pinged.events][:1] == ["CASE_STARTED"]
        reading = asyncio.create_task(read_stream(watcher, f"/cases/{case_id}/stream"))
        await asyncio.sleep(0.5)
        assert await keys.revoke(key_id)
        got = await asyncio.wait_for(reading, 5)  # ends at a ping after the cache's second
    assert "CASE_COMPLETED" not in [e.event for e in got.events]
    await ended(client, case_id)


async def test_a_stream_shows_sensitive_values_only_to_pii_readers(
    stack: InProcessStack, client: httpx.AsyncClient, pool: asyncpg.Pool,
) -> None:
    name = SAMPLE_APPLICATIONS[0]["applicantName"]
    case_id = (await client.post("/cases", json=LOAN)).json()["caseId"]
    await ended(client, case_id)
    plain = await read_stream(client, f"/cases/{case_id}/stream")
    assert name not in json.dumps([e.data for e in plain.events])
    assert "[pii:applicantName]" in json.dumps(plain.events[0].data)
    _, reader_key = await ApiKeyStore(pool).create("default", ("cases:read", "pii:read"),
                                                   "pii reader")
    async with httpx.AsyncClient(base_url=stack.base_url,
                                 headers={"Authorization": f"Bearer {reader_key}"}) as reader:
        clear = await read_stream(reader, f"/cases/{case_id}/stream")
    assert clear.events[0].data["payload"]["input"]["applicantName"] == name
    logged = await pool.fetchval("SELECT count(*) FROM access_log WHERE case_id = $1 AND "
                                 "action = 'pii:read'", uuid.UUID(case_id))
    assert logged == 1


@pytest.fixture
async def strict_api(settings: Settings, stack: InProcessStack) -> AsyncIterator[str]:
    """A second API process on the same stack: pings every second (so the credential is
    checked every second), and two streams per key at most."""
    async with serve_api(settings.model_copy(update={
            "stream_ping_seconds": 1.0, "stream_max_per_key": 2})) as url:
        yield url


async def test_a_busy_stream_ends_when_its_key_is_revoked(
    strict_api: str, client: httpx.AsyncClient, pool: asyncpg.Pool,
) -> None:
    """Events every few hundred milliseconds used to push the credential's check (at a
    keep-alive) back for ever: a revoked key kept receiving them."""
    keys = ApiKeyStore(pool)
    key_id, key = await keys.create("default", ("cases:read",), "busy watcher")
    busy = asyncio.Event()

    async def keep_busy() -> None:
        while not busy.is_set():
            await client.post("/cases", json=slow(100))
            await asyncio.sleep(0.3)

    feeding = asyncio.create_task(keep_busy())
    try:
        async with httpx.AsyncClient(base_url=strict_api,
                                     headers={"Authorization": f"Bearer {key}"}) as watcher:
            reading = asyncio.create_task(read_stream(watcher, "/events/stream"))
            await asyncio.sleep(2.0)
            assert await keys.revoke(key_id)
            revoked_at = asyncio.get_running_loop().time()
            got = await asyncio.wait_for(reading, 10)
            ended_after = asyncio.get_running_loop().time() - revoked_at
    finally:
        busy.set()
        await feeding
    assert got.events, "events flowed while the key was valid"
    assert ended_after < 5, ended_after  # a second's check, plus the key cache's second


async def test_streams_beyond_a_keys_limit_are_refused_with_429(
    strict_api: str, pool: asyncpg.Pool,
) -> None:
    _, key = await ApiKeyStore(pool).create("default", ("cases:read",), "greedy")
    async with httpx.AsyncClient(base_url=strict_api, timeout=10,
                                 headers={"Authorization": f"Bearer {key}"}) as greedy:
        async with greedy.stream("GET", "/events/stream") as first, \
                greedy.stream("GET", "/events/stream") as second:
            assert first.status_code == second.status_code == 200
            third = await greedy.get("/events/stream")
            assert third.status_code == 429, third.text
            assert "Retry-After" in third.headers and "limit" in third.text
        async def opens_again() -> bool:  # once the server has seen the two close
            async with greedy.stream("GET", "/events/stream") as again:
                return again.status_code == 200
        assert await wait_until(opens_again, timeout=10, interval=0.2)
