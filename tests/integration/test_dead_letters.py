"""``casetrail dead-letters``: an operator lists, reads and sends back what was set aside,
against the real consumer, broker and Postgres. The case: an event signed with a key
that was not registered yet is refused; once the key is registered, a redrive stores it.
A message that comes back after a redrive is not sent again unless asked."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from typing import Any

import aio_pika
import asyncpg
import httpx

from casetrail.adapters.bus.publisher import Publisher
from casetrail.adapters.bus.topology import Topology
from casetrail.adapters.store import KeyRegistry
from casetrail.agents.loan_officer import SAMPLE_APPLICATIONS
from casetrail.config import Settings
from casetrail.consumers.admission import KEY_REFRESH_SECONDS
from casetrail.contract.events import EVENT_TYPES, CaseErasedPayload, Event, make_event
from casetrail.contract.integrity import GENESIS, HEADER, Signer
from tests.support.helpers import CapabilityConnections, ended, wait_until
from tests.support.stack import module_stack
from tests.support.streams import read_stream

stack = module_stack(worker_concurrency=4)


def cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "casetrail.cli", "dead-letters", *args],
                          capture_output=True, text=True, env=settings.environment(),
                          timeout=60, check=False)


async def signed_event(worker_amqp: aio_pika.abc.AbstractRobustConnection,
                       topology: Topology, case_id: str, seq: int, signer: Signer) -> str:
    """A CASE_ERASED after the case's last event, signed by ``signer``, published with
    the worker's broker identity; its message id."""
    event = make_event(uuid.UUID(case_id), 1, seq, CaseErasedPayload(
        erased_by="operator", erased_at="2026-12-01T12:00:00Z", placeholders=()))
    await publish_as_worker(worker_amqp, topology, event, event.to_json(), signer)
    return str(event.event_id)


async def publish_as_worker(worker_amqp: aio_pika.abc.AbstractRobustConnection,
                            topology: Topology, event: Event, body: bytes,
                            signer: Signer) -> None:
    """``body`` published as ``event`` with the worker's broker identity, signed by
    ``signer`` as the first of its chain."""
    publisher = await Publisher.open(worker_amqp)
    await publisher.publish(topology.events_exchange, event.routing_key, body,
                            message_id=str(event.event_id), message_type=event.event_type,
                            correlation_id=str(event.case_id),
                            headers={HEADER: signer.seal(GENESIS, body).as_json()})
    await publisher.channel.close()


async def listed(settings: Settings, message_id: str) -> str | None:
    out = (await asyncio.to_thread(cli, settings, "list")).stdout
    lines = out.splitlines()
    found = [f"{line}\n{lines[n + 1]}" for n, line in enumerate(lines)
             if line.startswith(message_id)]
    return found[0] if found else None


async def test_a_refused_event_is_listed_shown_and_redriven_once(
    settings: Settings, topology: Topology, client: httpx.AsyncClient, pool: asyncpg.Pool,
    worker_amqp: aio_pika.abc.AbstractRobustConnection,
) -> None:
    case_id = (await client.post("/cases", json={"agent": "loan-officer",
                                                 "input": SAMPLE_APPLICATIONS[2]})
               ).json()["caseId"]
    await ended(client, case_id)
    count = "SELECT count(*) FROM event_log WHERE case_id = $1"
    before = await pool.fetchval(count, uuid.UUID(case_id))
    late_key = Signer.generate()  # a worker's key, not registered yet
    message_id = await signed_event(worker_amqp, topology, case_id, before, late_key)

    line = await wait_until(lambda: listed(settings, message_id), timeout=20)
    assert "CASE_ERASED" in line and case_id in line and "unknown_key" in line
    assert f"{settings.namespace}.events:case.default.{case_id}.CASE_ERASED" in line
    shown = await asyncio.to_thread(cli, settings, "show", message_id)
    assert shown.returncode == 0, shown.stderr
    letter: dict[str, Any] = json.loads(shown.stdout)
    assert letter["headers"][HEADER]["keyId"] == late_key.key_id  # the signature was kept
    assert json.loads(letter["body"])["eventType"] == "CASE_ERASED"
    assert (await asyncio.to_thread(cli, settings, "show", "no-such-id")).returncode == 1

    await KeyRegistry(pool).register(late_key.key_id, late_key.public_key)
    sent = await asyncio.to_thread(cli, settings, "redrive", message_id)
    assert sent.returncode == 0, sent.stderr
    assert f"redriven {message_id}" in sent.stdout

    async def stored() -> bool:
        return bool(await pool.fetchval(count, uuid.UUID(case_id)) == before + 1)
    await wait_until(stored, timeout=20)
    assert await listed(settings, message_id) is None  # gone from the dead letters

    # Once: a message refused again after its redrive stays put unless asked.
    stranger = Signer.generate()
    second = await signed_event(worker_amqp, topology, case_id, before + 1, stranger)
    await wait_until(lambda: listed(settings, second), timeout=20)
    assert (await asyncio.to_thread(cli, settings, "redrive", second)).returncode == 0
    line = await wait_until(lambda: listed(settings, second), timeout=20)
    assert "(redriven before)" in line
    refused = await asyncio.to_thread(cli, settings, "redrive", "--all",
                                      "--reason", "unknown_key")
    assert refused.returncode == 1 and "redriven once already" in refused.stderr
    assert await listed(settings, second) is not None
    again = await asyncio.to_thread(cli, settings, "redrive", second, "--again")
    assert again.returncode == 0 and f"redriven {second}" in again.stdout
    # Refused a third time (the key is still unknown): the dead letter is back, marked.
    assert "(redriven before)" in await wait_until(lambda: listed(settings, second), 20)
    cleared = await asyncio.to_thread(cli, settings, "list")
    assert cleared.returncode == 0


async def test_a_dead_letter_forged_by_another_component_is_not_redriven(
    settings: Settings, topology: Topology, capability_as: CapabilityConnections,
) -> None:
    """Any component may write to the dead-letter exchange. A capability worker's
    identity forges a 'refused event' whose headers say the worker published it: a
    routine redrive would have republished it as the worker. It is refused, naming why."""
    case_id = uuid.uuid4()
    event = make_event(case_id, 1, 0, CaseErasedPayload(
        erased_by="mallory", erased_at="2026-12-01T12:00:00Z", placeholders=()))
    publisher = await Publisher.open(await capability_as("credit-score"))
    await publisher.publish(
        topology.dead_letter_exchange, event.routing_key, event.to_json(),
        message_id=str(event.event_id), message_type=event.event_type,
        correlation_id=str(case_id), headers={
            "x-casetrail-reason": "unknown_key: key 0 is not registered",
            "x-original-exchange": topology.events_exchange,
            "x-original-routing-key": event.routing_key,
            "x-casetrail-original-user-id": settings.broker_user("worker")})
    await publisher.channel.close()
    await wait_until(lambda: listed(settings, str(event.event_id)), timeout=20)
    refused = await asyncio.to_thread(cli, settings, "redrive", str(event.event_id))
    assert refused.returncode == 1
    setter = settings.capability_user("credit-score")
    assert f"set aside by broker user {setter!r}" in refused.stderr
    assert await listed(settings, str(event.event_id)) is not None  # still held, not sent


async def test_a_live_stream_never_shows_an_event_the_record_would_refuse(
    settings: Settings, client: httpx.AsyncClient,
    worker_amqp: aio_pika.abc.AbstractRobustConnection,
) -> None:
    """A forged CASE_COMPLETED on the bus with the worker's broker identity (its password
    leaked, or a dead letter laundered back) but not its key: the consumer refuses it,
    and the tenant's live stream must not show it either."""
    forged_case = uuid.uuid4()
    forged = make_event(forged_case, 1, 0, CaseErasedPayload(
        erased_by="mallory", erased_at="2026-12-01T12:00:00Z", placeholders=()))
    body = forged.to_json()
    reading = asyncio.create_task(read_stream(client, "/events/stream", until=6))
    await asyncio.sleep(0.5)  # the stream's binding is in place
    await publish_as_worker(worker_amqp, Topology(settings.namespace), forged, body,
                            Signer.generate())
    case_id = (await client.post("/cases", json={"agent": "loan-officer",
                                                 "input": SAMPLE_APPLICATIONS[0]})
               ).json()["caseId"]
    got = await asyncio.wait_for(reading, 30)
    shown = {e.data["caseId"] for e in got.events}
    assert case_id in shown and str(forged_case) not in shown


async def test_a_signed_event_of_no_known_type_neither_shows_nor_breaks_a_stream(
    settings: Settings, client: httpx.AsyncClient, pool: asyncpg.Pool,
    worker_amqp: aio_pika.abc.AbstractRobustConnection,
) -> None:
    """An event signed with a registered key whose type carries a line break (a worker
    gone wrong): a stream writes an event's type and id as lines of its own, so such an
    event must not reach it, and the stream must go on with the events after it."""
    key = Signer.generate()
    await KeyRegistry(pool).register(key.key_id, key.public_key)
    odd_case = uuid.uuid4()
    event = make_event(odd_case, 1, 0, CaseErasedPayload(
        erased_by="operator", erased_at="2026-12-01T12:00:00Z", placeholders=()))
    envelope = json.loads(event.to_json())
    envelope["eventType"] = 'CASE_ERASED\ndata: {"injected": true}'
    body = json.dumps(envelope).encode()
    reading = asyncio.create_task(read_stream(client, "/events/stream", until=6))
    await asyncio.sleep(0.5)  # the stream's binding is in place
    await publish_as_worker(worker_amqp, Topology(settings.namespace), event, body, key)
    # The API reads the keys again within a second of meeting the new one: the odd event
    # has reached the stream, or been left out, before the case's first event.
    await asyncio.sleep(KEY_REFRESH_SECONDS + 0.5)
    case_id = (await client.post("/cases", json={"agent": "loan-officer",
                                                 "input": SAMPLE_APPLICATIONS[0]})
               ).json()["caseId"]
    got = await asyncio.wait_for(reading, 30)
    shown = {e.data["caseId"] for e in got.events}
    assert case_id in shown and str(odd_case) not in shown  # it went on past the odd one
    assert all(e.event in EVENT_TYPES and "injected" not in e.data for e in got.events)
