"""Least privilege, attacked: each forgery is made with another component's real
credentials on the real broker and the real Postgres, and each is refused — by the
broker's permissions, by the database's grants, or by the receiving component, which
checks whose message it holds (``user_id``, vouched for by the broker) and
dead-letters it with the reason."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aio_pika
import aiormq
import asyncpg
import httpx
import orjson
import pytest

from casetrail.adapters.bus.publisher import Publisher
from casetrail.adapters.bus.rpc import BusWorkerRuntime, RetryPolicy
from casetrail.adapters.bus.topology import Topology
from casetrail.adapters.store import component_pool
from casetrail.adapters.store.privileges import privileges_table
from casetrail.agents import CAPABILITIES
from casetrail.agents.loan_officer import SAMPLE_APPLICATIONS
from casetrail.components.capability_worker import CapabilityWorker
from casetrail.config import Settings
from casetrail.contract.commands import (
    CancelCommand,
    CaseStartCommand,
    EraseCommand,
    ToolReply,
    ToolRequest,
)
from casetrail.contract.integrity import Signer
from casetrail.errors import PublishRejected
from casetrail.trail.keyfile import write_signer
from tests.support import ROOT
from tests.support.broker import rabbitmqctl_json
from tests.support.events import started
from tests.support.helpers import CapabilityConnections, dead_letter_for, ended, wait_until
from tests.support.stack import InProcessStack, kill_leftovers, module_stack, spawn

stack = module_stack(worker_concurrency=4)

SLOW = {"agent": "loan-officer", "input": SAMPLE_APPLICATIONS[0],
        "model": {"provider": "scripted", "name": "slow", "latencyMs": 400}}


async def as_user(settings: Settings, component: str) -> AsyncIterator[Publisher]:
    """A publisher as a component's user, or as a capability's (``capability:NAME``)."""
    kind, _, capability = component.partition(":")
    identity = settings.capability_identity(capability) if capability else \
        settings.identity(kind)  # type: ignore[arg-type]
    connection = await aio_pika.connect(identity.amqp_url)
    try:
        yield await Publisher.open(connection)  # type: ignore[arg-type]
    finally:
        await connection.close()


@pytest.fixture
async def api_publisher(settings: Settings) -> AsyncIterator[Publisher]:
    async for publisher in as_user(settings, "api"):
        yield publisher


@pytest.fixture
async def capability_publisher(settings: Settings) -> AsyncIterator[Publisher]:
    async for publisher in as_user(settings, "capability:credit-score"):
        yield publisher


# -- the database ------------------------------------------------------------------------

@pytest.mark.parametrize(("component", "statement"), [
    ("consumer", "UPDATE event_log SET payload = '{}'"),
    ("consumer", "DELETE FROM event_log"),
    ("consumer", "TRUNCATE event_log"),
    ("consumer", "UPDATE cases SET input = '{}'"),
    ("api", "INSERT INTO event_log (event_id, case_id, attempt, seq, event_type, occurred_at, "
            "schema_version, payload) VALUES (gen_random_uuid(), gen_random_uuid(), 1, 0, "
            "'CASE_STARTED', now(), 1, '{}')"),
    ("api", "UPDATE cases SET status = 'completed'"),
    ("api", "INSERT INTO api_keys (key_id, key_hash, tenant_id, scopes) "
            "VALUES ('x', 'x', 'default', '{admin}')"),
    ("worker", "DELETE FROM event_log"),
    ("worker", "UPDATE cases SET answer = '{}'"),
    ("worker", "ALTER TABLE event_log DISABLE TRIGGER ALL"),
    ("api", "SET session_replication_role = replica"),
    # The transparency log: only the ledger appends, and never rewrites.
    ("ledger", "INSERT INTO event_log (event_id, case_id, attempt, seq, event_type, "
               "occurred_at, schema_version, payload) VALUES (gen_random_uuid(), "
               "gen_random_uuid(), 1, 0, 'CASE_STARTED', now(), 1, '{}')"),
    ("ledger", "DELETE FROM ledger_leaves"),
    ("ledger", "UPDATE ledger_checkpoints SET note = ''"),
    ("ledger", "DELETE FROM ledger_tiles"),
    ("api", "INSERT INTO ledger_tiles (level, tile_index, hashes) VALUES (0, 0, '\\x00')"),
    ("api", "DELETE FROM ledger_checkpoints"),
    ("consumer", "DELETE FROM ledger_queue"),
    ("worker", "INSERT INTO ledger_leaves VALUES (0, gen_random_uuid(), gen_random_uuid())"),
    # Personal data is erased a whole case at a time, through the owner's function.
    ("api", "UPDATE case_secrets SET wrapped_key = NULL, erased_at = now(), erased_by = 'x'"),
    ("api", "DELETE FROM case_keys"),
    # Keys are registered by an operator: a worker's password cannot vouch for a key.
    ("worker", "INSERT INTO signing_keys (key_id, public_key) VALUES ('0123456789abcdef', "
               "'\\x00')"),
])
async def test_a_component_role_cannot_do_what_another_does(
    settings: Settings, database: str, component: str, statement: str,
) -> None:
    pool = await component_pool(settings.identity(component), 1)  # type: ignore[arg-type]
    try:
        with pytest.raises((asyncpg.InsufficientPrivilegeError,
                            asyncpg.exceptions.InsufficientPrivilegeError)):
            await pool.execute(statement)
    finally:
        await pool.close()


async def test_even_replica_mode_does_not_switch_the_append_only_triggers_off(
    pool: asyncpg.Pool, stack: InProcessStack, client: httpx.AsyncClient,
) -> None:
    """``session_replication_role = replica`` skips ordinary triggers; these fire ALWAYS."""
    case_id = (await client.post("/cases", json={**SLOW, "model": None})).json()["caseId"]
    await ended(client, case_id)
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SET LOCAL session_replication_role = replica")
        with pytest.raises(asyncpg.RaiseError, match="append-only"):
            await conn.execute("DELETE FROM event_log WHERE case_id = $1", uuid.UUID(case_id))


async def test_a_tile_of_the_log_may_only_grow(settings: Settings, pool: asyncpg.Pool) -> None:
    """The ledger may extend a tile (it appends), but no one may shorten or change one."""
    full = bytes(range(32)) * 2
    await pool.execute("INSERT INTO ledger_tiles (level, tile_index, hashes) VALUES (7, 0, $1) "
                       "ON CONFLICT DO NOTHING", full)
    ledger = await component_pool(settings.identity("ledger"), 1)
    try:
        for changed in (full[:32], bytes(64), full[:32] + bytes(64)):
            with pytest.raises(asyncpg.RaiseError, match="may only grow"):
                await ledger.execute("UPDATE ledger_tiles SET hashes = $1 WHERE level = 7",
                                     changed)
        await ledger.execute("UPDATE ledger_tiles SET hashes = $1 WHERE level = 7",
                             full + bytes(32))
    finally:
        await ledger.close()


# -- the broker's permissions --------------------------------------------------------------

async def test_only_the_worker_may_publish_case_events(
    settings: Settings, stack: InProcessStack, api_publisher: Publisher,
    capability_publisher: Publisher,
) -> None:
    topology = Topology(settings.namespace)
    event = started(uuid.uuid4())
    for publisher in (api_publisher, capability_publisher):
        with pytest.raises(PublishRejected, match=r"ACCESS_REFUSED|may not publish"):
            await publisher.publish(topology.events_exchange, event.routing_key, event.to_json())


async def test_the_worker_may_not_publish_ledger_checkpoints(
    settings: Settings, worker_amqp: aio_pika.abc.AbstractRobustConnection,
) -> None:
    publisher = await Publisher.open(worker_amqp)
    with pytest.raises(PublishRejected, match=r"ACCESS_REFUSED|may not publish"):
        await publisher.publish(Topology(settings.namespace).events_exchange,
                                "ledger.checkpoint", b"forged")


async def test_the_ledger_publishes_checkpoints_and_nothing_else(settings: Settings) -> None:
    topology = Topology(settings.namespace)
    async for publisher in as_user(settings, "ledger"):
        await publisher.publish(topology.events_exchange, Topology.CHECKPOINT_KEY, b"note")
        event = started(uuid.uuid4())
        with pytest.raises(PublishRejected, match=r"ACCESS_REFUSED|may not publish"):
            await publisher.publish(topology.events_exchange, event.routing_key,
                                    event.to_json())


async def test_only_the_api_may_send_cancels(
    settings: Settings, worker_amqp: aio_pika.abc.AbstractRobustConnection,
) -> None:
    """(The worker may send start commands: its sweeper re-sends a stranded case's,
    service/components/sweeper.py. A start command only names a case; an erase command from it is
    refused by the worker that receives it, below.)"""
    topology = Topology(settings.namespace)
    publisher = await Publisher.open(worker_amqp)
    with pytest.raises(PublishRejected, match=r"ACCESS_REFUSED|may not publish"):
        await publisher.publish(topology.cancel_exchange, "", b"{}")


async def test_an_erase_command_from_the_worker_is_dead_lettered(
    settings: Settings, stack: InProcessStack,
    worker_amqp: aio_pika.abc.AbstractRobustConnection,
    amqp: aio_pika.abc.AbstractRobustConnection,
) -> None:
    topology = Topology(settings.namespace)
    publisher = await Publisher.open(worker_amqp)
    forged_id = uuid.uuid4()
    await publisher.publish(topology.commands_exchange, Topology.ERASE_KEY,
                            EraseCommand(case_id=forged_id).to_json(),
                            message_type=EraseCommand.MESSAGE_TYPE,
                            message_id=f"erase-{forged_id}")
    reason = await dead_letter_for(amqp, topology, f"erase-{forged_id}")
    assert "start command from broker user" in reason
    assert settings.broker_user("worker") in reason


@pytest.mark.parametrize(("component", "queue"), [
    ("api", "capability.credit-score"), ("consumer", "case-start"),
    ("worker", "event-log"), ("capability:credit-score", "dead-letters"),
    ("api", "event-log"),
    # One capability's user reads its own requests, never another capability's (a
    # customer's name in a sanctions request is not the credit bureau's to see).
    ("capability:credit-score", "capability.sanctions-screening"),
    ("capability:sanctions-screening", "capability.credit-score"),
])
async def test_a_component_cannot_read_another_ones_queue(
    settings: Settings, database: str, component: str, queue: str,
) -> None:
    kind, _, capability = component.partition(":")
    identity = settings.capability_identity(capability) if capability else \
        settings.identity(kind)  # type: ignore[arg-type]
    connection = await aio_pika.connect(identity.amqp_url)
    try:
        channel = await connection.channel()
        declared = await channel.get_queue(f"{settings.namespace}.{queue}", ensure=True)
        with pytest.raises(aiormq.exceptions.ChannelAccessRefused):
            await declared.consume(_ignore)
    finally:
        await connection.close()


async def _ignore(message: aio_pika.abc.AbstractIncomingMessage) -> None:
    raise AssertionError("a refused consumer received a message")


async def test_a_capability_user_cannot_bind_a_spy_queue_to_the_requests(
    settings: Settings, database: str,
) -> None:
    """A compromised capability worker tries to hear another capability's requests by
    binding a queue of its own to <ns>.capabilities: it may declare nothing, and it may
    not bind another capability's queue to anything either."""
    topology = Topology(settings.namespace)
    spy = f"{settings.namespace}.capability.spy"
    connection = await aio_pika.connect(settings.capability_identity("credit-score").amqp_url)
    try:
        channel = await connection.channel()
        with pytest.raises(aiormq.exceptions.ChannelAccessRefused):
            await channel.declare_queue(spy, exclusive=True)
        channel = await connection.channel()
        with pytest.raises(aiormq.exceptions.ChannelAccessRefused):
            await channel.declare_queue("", exclusive=True)  # a server-named one
        channel = await connection.channel()
        own = await channel.get_queue(topology.capability_queue("credit-score"), ensure=False)
        with pytest.raises(aiormq.exceptions.ChannelAccessRefused):
            await own.bind(topology.capabilities_exchange, "sanctions-screening")
    finally:
        await connection.close()


# -- the receivers' checks -------------------------------------------------------------------

@pytest.mark.parametrize("queue", ["event-log", "case-start", "capability.credit-score"])
async def test_no_component_writes_to_the_default_exchange(
    settings: Settings, stack: InProcessStack, capability_publisher: Publisher, queue: str,
) -> None:
    """The default exchange reaches every queue by its name: the capability user used
    to write there (its replies went that way) and so could put a message into the
    event log, the start queue or another capability's queue. Replies now go through
    <ns>.replies, and the broker refuses the default exchange."""
    with pytest.raises(PublishRejected, match="ACCESS_REFUSED"):
        await capability_publisher.publish("", f"{settings.namespace}.{queue}", b"{}")


async def test_an_event_from_another_identity_is_dead_lettered(
    settings: Settings, stack: InProcessStack, amqp: aio_pika.abc.AbstractRobustConnection,
    pool: asyncpg.Pool,
) -> None:
    """No component but the worker may publish case events (the broker sees to it);
    behind that, the consumer refuses any event another broker user put in its queue
    (here the admin, which can write anywhere)."""
    topology = Topology(settings.namespace)
    event = started(uuid.uuid4())
    admin = await Publisher.open(amqp)
    await admin.publish("", topology.event_log_queue, event.to_json(),
                        message_id=str(event.event_id))
    reason = await dead_letter_for(amqp, topology, str(event.event_id))
    assert "'guest'" in reason and settings.broker_user("worker") in reason
    assert not await pool.fetchval("SELECT count(*) FROM event_log WHERE event_id = $1",
                                   event.event_id)


async def test_a_start_command_from_another_identity_is_dead_lettered(
    settings: Settings, stack: InProcessStack, client: httpx.AsyncClient,
    amqp: aio_pika.abc.AbstractRobustConnection, pool: asyncpg.Pool,
) -> None:
    """A case queued by the API but started by someone else's command does not run on
    that command (it runs on the API's own, from its row)."""
    topology = Topology(settings.namespace)
    forged_id = uuid.uuid4()
    command = CaseStartCommand(case_id=forged_id, agent="loan-officer")
    admin = await Publisher.open(amqp)
    await admin.publish("", topology.case_start_queue, command.to_json(),
                        message_id=f"forged-{forged_id}")
    reason = await dead_letter_for(amqp, topology, f"forged-{forged_id}")
    assert "start command from broker user 'guest'" in reason


async def test_a_cancel_needs_the_api_and_postgres_to_agree(
    settings: Settings, stack: InProcessStack, client: httpx.AsyncClient,
    api_publisher: Publisher, amqp: aio_pika.abc.AbstractRobustConnection,
) -> None:
    topology = Topology(settings.namespace)
    case_id = (await client.post("/cases", json=SLOW)).json()["caseId"]
    await wait_until(lambda: _running(stack, case_id))
    command = CancelCommand(case_id=uuid.UUID(case_id), reason="forged", by="key:nobody")
    # From the API's own user, but Postgres has no request: ignored.
    await api_publisher.publish(topology.cancel_exchange, "", command.to_json())
    # From another user, straight into the worker's cancel queue: dead-lettered.
    channel_queues = [name for name in await _worker_queues(settings) if ".cancel." in name]
    assert channel_queues
    admin = await Publisher.open(amqp)
    await admin.publish("", channel_queues[0], command.to_json(),
                        message_id=f"cancel-{case_id}")
    reason = await dead_letter_for(amqp, topology, f"cancel-{case_id}")
    assert "cancel from broker user" in reason
    case = await ended(client, case_id)
    assert case["status"] == "completed"  # neither stopped it
    # The real thing: the API records the request, then broadcasts it.
    other = (await client.post("/cases", json=SLOW)).json()["caseId"]
    await wait_until(lambda: _running(stack, other))
    assert (await client.post(f"/cases/{other}/cancel", json={"reason": "real"})).status_code \
        == 202
    assert (await ended(client, other))["status"] == "cancelled"


async def _running(stack: InProcessStack, case_id: str) -> bool:
    return uuid.UUID(case_id) in stack.worker._live


async def _worker_queues(settings: Settings) -> list[str]:
    listed = await asyncio.to_thread(rabbitmqctl_json, "list_queues", "name")
    return [q["name"] for q in listed
            if q["name"].startswith(settings.namespace + ".")]


async def test_a_tool_reply_is_taken_only_from_the_capability_user_with_its_token(
    settings: Settings, stack: InProcessStack, worker_amqp: aio_pika.abc.AbstractRobustConnection,
    amqp: aio_pika.abc.AbstractRobustConnection, capability_publisher: Publisher,
) -> None:
    """Nobody serves ``nobody-home``: the test reads the request itself, then answers it
    as the admin (refused: wrong user), as another capability's user holding the
    request's token, i.e. a reply to a request it did not receive (refused), as
    nobody-home's user with a guessed token (ignored), and as nobody-home's user with
    the request's token (taken)."""
    topology = Topology(settings.namespace)
    runtime = BusWorkerRuntime(worker_amqp, topology, await Publisher.open(worker_amqp),
                               settings.capability_user,
                               default_policy=RetryPolicy(attempts=1, timeout_seconds=8))
    await runtime.start()
    try:
        call_id = str(uuid.uuid4())
        call = asyncio.create_task(runtime.execute("nobody-home", {"x": 1}, call_id=call_id))
        channel = await amqp.channel()
        queue = await channel.get_queue(topology.capability_queue("nobody-home"), ensure=False)
        request_message = await wait_until(lambda: queue.get(fail=False, no_ack=True))
        request = ToolRequest.model_validate(orjson.loads(request_message.body))
        assert request.idempotency_key == call_id
        assert request_message.correlation_id != call_id  # not derivable from the call

        def reply(result: str) -> bytes:
            return orjson.dumps(ToolReply(idempotency_key=call_id, attempt=1, ok=True,
                                          result=result, worker="x").model_dump(by_alias=True))

        admin = await Publisher.open(amqp)
        await admin.publish("", str(request_message.reply_to), reply("from the admin"),
                            correlation_id=request_message.correlation_id,
                            message_id=f"reply-{call_id}")
        reason = await dead_letter_for(amqp, topology, f"reply-{call_id}")
        assert "tool reply from broker user 'guest'" in reason
        replies = topology.replies_exchange
        await capability_publisher.publish(replies, str(request_message.reply_to),
                                           reply("forged by credit-score"),
                                           correlation_id=request_message.correlation_id,
                                           message_id=f"forged-{call_id}")
        reason = await dead_letter_for(amqp, topology, f"forged-{call_id}")
        assert settings.capability_user("credit-score") in reason
        assert "not the user of capability 'nobody-home'" in reason
        assert not call.done()
        async for own in as_user(settings, "capability:nobody-home"):
            await own.publish(replies, str(request_message.reply_to), reply("guessed"),
                              correlation_id=call_id)
            await asyncio.sleep(0.3)
            assert not call.done()
            await own.publish(replies, str(request_message.reply_to), reply("the answer"),
                              correlation_id=request_message.correlation_id)
            result = await asyncio.wait_for(call, 5)
        assert result.result == "the answer"
        await channel.close()
    finally:
        await runtime.close()


async def test_the_answer_cache_is_keyed_by_arguments_too(
    settings: Settings, capability_as: CapabilityConnections,
    worker_amqp: aio_pika.abc.AbstractRobustConnection, stack: InProcessStack,
) -> None:
    """A request reusing an idempotency key with other arguments is not handed the
    first request's answer."""
    topology = Topology(settings.namespace)
    runtime = BusWorkerRuntime(worker_amqp, topology, await Publisher.open(worker_amqp),
                               settings.capability_user)
    await runtime.start()
    worker = CapabilityWorker(await capability_as("credit-score"), topology,
                              [CAPABILITIES["credit-score"]], name="cache-test")
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(worker.run(stop, ready))
    await asyncio.wait_for(ready.wait(), 10)
    try:
        key = str(uuid.uuid4())
        first = await runtime.execute("credit-score", {"applicantId": "A-1001"}, call_id=key)
        second = await runtime.execute("credit-score", {"applicantId": "A-1002"}, call_id=key)
        again = await runtime.execute("credit-score", {"applicantId": "A-1001"}, call_id=key)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await runtime.close()
    assert first.result is not None and second.result is not None
    results: list[Any] = [first.result, second.result, again.result]
    assert results[0]["applicantId"] == "A-1001" and results[1]["applicantId"] == "A-1002"
    assert results[2] == results[0]


async def test_a_worker_whose_key_no_operator_registered_refuses_to_start(
    settings: Settings, database: str, tmp_path: Path,
) -> None:
    """The worker's role cannot register a key, and a worker does not sign with a key
    nobody registered: it exits at start, naming the operator's step."""
    key_file = tmp_path / "unregistered.pem"
    write_signer(key_file, Signer.generate())
    worker = spawn(settings, "worker", CASETRAIL_SIGNING_KEY_FILE=str(key_file),
                   CASETRAIL_WORKER_METRICS_PORT="0")
    try:
        code = await asyncio.to_thread(worker.wait, 60)
    finally:
        kill_leftovers({"worker": worker})
    log = Path(worker.log_path).read_text()  # type: ignore[attr-defined]  # noqa: ASYNC240
    assert code != 0
    assert "is not registered" in log and "casetrail signer register" in log


async def test_docs_show_every_roles_grants_as_setup_made_them(
    settings: Settings, database: str,
) -> None:
    """docs/security.md's table of the database roles' privileges is the one read back
    from a namespace `casetrail setup` made (regenerate: `python -m
    casetrail.adapters.store.privileges`, on a namespace set up with this release)."""
    documented = (ROOT / "docs" / "security.md").read_text()
    begin, end = "<!-- privileges: begin -->\n", "<!-- privileges: end -->"
    assert begin in documented and end in documented
    shown = documented.split(begin, 1)[1].split(end, 1)[0]
    assert shown == await privileges_table(settings)
