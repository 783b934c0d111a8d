"""No accepted case is stranded: a publish the broker nacked is published again; a case
handed back while a redelivered copy of its start command waits is run by that copy;
and a case whose start command was lost altogether is found by a worker's sweeper and
started again. Against the real RabbitMQ and Postgres, the worker a real process."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aio_pika
import asyncpg
import httpx
import pytest

from casetrail.adapters.bus.publisher import Publisher
from casetrail.adapters.bus.topology import Topology
from casetrail.contract.events import TERMINAL_EVENT_TYPES
from casetrail.errors import PublishRejected
from casetrail.ops.setup import rabbitmqctl_environment
from tests.support.helpers import ended, wait_until
from tests.support.metrics import scrape, total
from tests.support.stack import (
    api_ready,
    free_port,
    kill_leftovers,
    namespace_of_its_own,
    replace_worker,
    spawn,
    stop_cleanly,
    stop_worker,
)

APPLICATION = {"applicantId": "A-3208", "applicantName": "Ines Varga", "loanAmount": 15000,
               "termMonths": 36, "monthlyIncome": 7000, "monthlyDebt": 1400,
               "purpose": "car"}


async def test_a_publish_the_broker_nacks_is_published_again(
    amqp: aio_pika.abc.AbstractRobustConnection,
) -> None:
    """A full queue with ``reject-publish`` nacks every publish routed to it, as a
    quorum queue between leaders does: the publish goes out again until the broker
    takes it. With ``retry_nacks`` off (the API's start commands) it is refused at once."""
    name = f"casetrail-test-nack-{uuid.uuid4().hex[:8]}"
    channel = await amqp.channel()
    exchange = await channel.declare_exchange(name, aio_pika.ExchangeType.TOPIC,
                                              auto_delete=True)
    refusing = await channel.declare_queue(
        f"{name}.refusing", arguments={"x-max-length": 0, "x-overflow": "reject-publish"})
    await refusing.bind(exchange, "case.#")
    taking = await channel.declare_queue(f"{name}.taking")
    await taking.bind(exchange, "case.#")
    publisher = await Publisher.open(amqp, retry_seconds=20.0)
    impatient = await Publisher.open(amqp, retry_seconds=20.0, retry_nacks=False)
    try:
        with pytest.raises(PublishRejected, match="Nack"):
            await impatient.publish(name, "case.x", b"refused at once")

        async def lift() -> None:
            await asyncio.sleep(1.0)
            await refusing.delete(if_unused=False, if_empty=False)

        lifting = asyncio.create_task(lift())
        await publisher.publish(name, "case.x", b"taken in the end", message_id="m-1")
        await lifting
        # A nack says not every queue took it: those that did keep their copy (so a
        # message published again can arrive twice; event ids make that harmless).
        bodies = []
        while (message := await taking.get(no_ack=True, fail=False)) is not None:
            bodies.append(message.body)
        assert b"taken in the end" in bodies
        assert set(bodies) <= {b"refused at once", b"taken in the end"}
    finally:
        await taking.delete(if_unused=False, if_empty=False)
        await channel.close()


@pytest.fixture(scope="module")
async def stranding(settings: Any, database: str) -> AsyncIterator[dict[str, Any]]:
    """API, consumer and capability worker as processes in a namespace of their own;
    each test starts (and kills) its worker."""
    async with namespace_of_its_own(settings, "stranded") as (own, pool, key):
        port = free_port()
        children = {
            "api": spawn(own, "api", "--port", str(port)),
            "consumer": spawn(own, "consumer"),
            "capability": spawn(own, "capability-worker"),
        }
        base_url = f"http://127.0.0.1:{port}"
        amqp = await aio_pika.connect_robust(own.amqp_url)  # the bootstrap user
        try:
            await wait_until(lambda: api_ready(base_url), timeout=30, interval=0.2)
            yield {"settings": own, "base_url": base_url, "pool": pool, "amqp": amqp,
                   "children": children, "headers": {"Authorization": f"Bearer {key}"}}
            await stop_cleanly(children)
        finally:
            await amqp.close()
            kill_leftovers(children)


def start_worker(stranding: dict[str, Any], **env: str) -> subprocess.Popen[bytes]:
    return replace_worker(stranding["settings"], stranding["children"], **env)


async def start_slow_case(client: httpx.AsyncClient, turn_ms: int) -> uuid.UUID:
    reply = await client.post("/cases", json={
        "agent": "loan-officer", "input": APPLICATION,
        "model": {"provider": "scripted", "name": "slow", "latencyMs": turn_ms},
        "limits": {"maxCycles": 10, "deadlineSeconds": 300}})
    assert reply.status_code == 202, reply.text
    return uuid.UUID(reply.json()["caseId"])


async def cycles_stored(pool: asyncpg.Pool, case_id: uuid.UUID) -> int:
    count: int = await pool.fetchval(
        "SELECT count(*) FROM event_log WHERE case_id = $1 AND event_type = 'REACT_CYCLE'",
        case_id)
    return count


async def attempts_claimed(pool: asyncpg.Pool, case_id: uuid.UUID) -> int:
    count: int = await pool.fetchval(
        "SELECT attempts_claimed FROM cases WHERE case_id = $1", case_id)
    return count


async def assert_ended_once_and_verified(client: httpx.AsyncClient, pool: asyncpg.Pool,
                                         case_id: uuid.UUID) -> dict[str, Any]:
    view = await ended(client, case_id, timeout=120)
    assert view["status"] == "completed", view
    terminals = await pool.fetchval(
        "SELECT count(*) FROM event_log WHERE case_id = $1 AND event_type = ANY($2)",
        case_id, list(TERMINAL_EVENT_TYPES))
    assert terminals == 1
    report = (await client.get(f"/cases/{case_id}/verify")).json()
    assert report["verified"] and report["complete"], report
    return view


def close_connections_of(user: str) -> int:
    """Close (as the broker does when a node is lost) every connection of ``user``."""
    listed = subprocess.run(["rabbitmqctl", "-q", "list_connections", "pid", "user"],
                            check=True, capture_output=True, text=True,
                            env=rabbitmqctl_environment())
    rows = [line.split("\t") for line in listed.stdout.splitlines() if "\t" in line]
    pids = [pid for pid, owner in rows if owner == user]
    for pid in pids:
        subprocess.run(["rabbitmqctl", "-q", "close_connection", pid, "node lost (test)"],
                       check=True, capture_output=True, env=rabbitmqctl_environment())
    return len(pids)


async def start_queue_depth(stranding: dict[str, Any]) -> int:
    channel = await stranding["amqp"].channel()
    try:
        raw = await channel.get_underlay_channel()  # aio-pika caches a passive declare
        declared = await raw.queue_declare(
            Topology(stranding["settings"].namespace).case_start_queue, passive=True)
        return declared.message_count or 0
    finally:
        await channel.close()


async def test_re_sent_requests_publish_at_most_one_start_command(
    stranding: dict[str, Any],
) -> None:
    """The flood: the same Idempotency-Key re-sent 30 times while its case is queued
    (no worker runs here) used to publish a start command each time. Now a re-send
    publishes only while the first publish is unconfirmed, and then one copy."""
    stop_worker(stranding["children"])
    pool = stranding["pool"]
    request = {"agent": "loan-officer", "input": APPLICATION}
    headers = {**stranding["headers"], "Idempotency-Key": f"flood-{uuid.uuid4()}"}
    async with httpx.AsyncClient(base_url=stranding["base_url"], timeout=30,
                                 headers=headers) as client:
        before = await start_queue_depth(stranding)
        first = await client.post("/cases", json=request)
        assert first.status_code == 202, first.text
        case_id = uuid.UUID(first.json()["caseId"])
        await wait_until(lambda: pool.fetchval(
            "SELECT start_confirmed_at IS NOT NULL FROM cases WHERE case_id = $1", case_id))
        again = await asyncio.gather(*(client.post("/cases", json=request)
                                       for _ in range(30)))
        assert {r.status_code for r in again} == {202}
        assert {r.json()["caseId"] for r in again} == {str(case_id)}
        assert await start_queue_depth(stranding) == before + 1
        # The first request died before the broker's confirm (as if): re-sends then
        # publish again, one copy however many arrive at once.
        await pool.execute("UPDATE cases SET start_confirmed_at = NULL, "
                           "start_publishing_until = NULL WHERE case_id = $1", case_id)
        again = await asyncio.gather(*(client.post("/cases", json=request)
                                       for _ in range(10)))
        assert {r.status_code for r in again} == {202}
        assert await start_queue_depth(stranding) == before + 2


async def test_a_case_handed_back_while_a_copy_of_its_start_command_waits_runs_again(
    stranding: dict[str, Any],
) -> None:
    """The node-loss path that stranded cases: the worker's connection is lost (the
    broker requeues the start command, and hands the copy back to the same worker,
    where the case still runs), then its publishes are refused until it hands the case
    back — with the original delivery's channel gone, that nack goes nowhere. The copy
    must then run the case (here the sweeper is held off, so only the copy can)."""
    own, pool = stranding["settings"], stranding["pool"]
    start_worker(stranding, CASETRAIL_PUBLISH_RETRY_SECONDS="6",
                 CASETRAIL_SWEEP_SECONDS="3600")
    events = Topology(own.namespace).events_exchange
    async with httpx.AsyncClient(base_url=stranding["base_url"], timeout=30,
                                 headers=stranding["headers"]) as client:
        case_id = await start_slow_case(client, turn_ms=1500)
        await wait_until(lambda: cycles_stored(pool, case_id), timeout=30)
        channel = await stranding["amqp"].channel()
        # Every event published from now on is nacked by the broker.
        refusing = await channel.declare_queue(
            f"{own.namespace}.refusing", arguments={"x-max-length": 0,
                                                    "x-overflow": "reject-publish"})
        await refusing.bind(events, "case.#")
        try:
            assert await asyncio.to_thread(close_connections_of,
                                           own.broker_user("worker")) == 1
            # The case is handed back, and taken again as attempt 2 by the copy.
            await wait_until(lambda: _claimed_twice(pool, case_id), timeout=60,
                             interval=0.2)
        finally:
            await refusing.delete(if_unused=False, if_empty=False)
            await channel.close()
        view = await assert_ended_once_and_verified(client, pool, case_id)
        assert view["attempts"] >= 2


async def _claimed_twice(pool: asyncpg.Pool, case_id: uuid.UUID) -> bool:
    return await attempts_claimed(pool, case_id) >= 2


async def test_a_running_case_whose_start_command_was_lost_is_started_again(
    stranding: dict[str, Any],
) -> None:
    """The safety net: the worker running a case dies, and its start command is deleted
    from the queue by hand (as a lost node or a purge would). A worker's sweeper finds
    the case once its lease has lapsed and sends the command again; the case resumes."""
    own, pool = stranding["settings"], stranding["pool"]
    env = {"CASETRAIL_LEASE_SECONDS": "2", "CASETRAIL_SWEEP_SECONDS": "0.5"}
    worker = start_worker(stranding, **env)
    async with httpx.AsyncClient(base_url=stranding["base_url"], timeout=30,
                                 headers=stranding["headers"]) as client:
        case_id = await start_slow_case(client, turn_ms=800)
        await wait_until(lambda: cycles_stored(pool, case_id), timeout=30)
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()
        channel = await stranding["amqp"].channel()
        queue = await channel.declare_queue(Topology(own.namespace).case_start_queue,
                                            passive=True)

        async def requeued() -> bool:
            raw = await channel.get_underlay_channel()  # aio-pika caches a passive declare
            declared = await raw.queue_declare(queue.name, passive=True)
            return (declared.message_count or 0) >= 1

        await wait_until(requeued, timeout=15)
        await queue.purge()
        await channel.close()
        metrics_port = free_port()
        start_worker(stranding, CASETRAIL_WORKER_METRICS_PORT=str(metrics_port), **env)
        view = await assert_ended_once_and_verified(client, pool, case_id)
        assert view["attempts"] == 2
        resumed = await pool.fetchval(
            "SELECT payload->'resumedFrom' FROM event_log WHERE case_id = $1 "
            "AND attempt = 2 AND event_type = 'CASE_STARTED'", case_id)
        assert resumed is not None  # it went on from the record, not from scratch
        samples = await scrape(metrics_port)
        assert total(samples, "casetrail_stranded_cases_resent_total") >= 1
