"""The durable pipeline against the real RabbitMQ and Postgres: publisher → broker →
event-log consumer → event_log and cases."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aio_pika
import asyncpg
import orjson
import pytest

from casetrail.adapters.bus.publisher import Publisher, event_emitter
from casetrail.adapters.bus.topology import Topology
from casetrail.adapters.store import CaseStore, NewCase
from casetrail.adapters.store.writer import EventLogWriter
from casetrail.consumers.admission import Admission
from casetrail.consumers.event_log import REASON_HEADER, EventLogConsumer
from casetrail.contract.events import (
    ZERO_USAGE,
    CaseAwaitingReviewPayload,
    CaseCancelledPayload,
    CaseCompletedPayload,
    CaseFailedPayload,
    CaseTimedOutPayload,
    Event,
    SignedEvent,
    event_from_json,
    make_event,
    seal_chain,
)
from casetrail.contract.integrity import Signer, canonical
from casetrail.errors import PublishRejected
from casetrail.trail.emitter import TrailEmitter
from tests.support.events import USAGE, completed, cycle, started
from tests.support.helpers import wait_until


@pytest.fixture(scope="module")
async def consumer(
    consumer_amqp: aio_pika.abc.AbstractRobustConnection, consumer_pool: asyncpg.Pool,
    topology: Topology, admission: Admission,
) -> AsyncIterator[EventLogConsumer]:
    stop, ready = asyncio.Event(), asyncio.Event()
    worker = EventLogConsumer(consumer_amqp, EventLogWriter(consumer_pool), topology, admission,
                              linger=0.002)
    task = asyncio.create_task(worker.run(stop, ready))
    await asyncio.wait_for(ready.wait(), 10)
    yield worker
    stop.set()
    await asyncio.wait_for(task, 10)


@pytest.fixture(scope="module")
async def publisher(worker_amqp: aio_pika.abc.AbstractRobustConnection) -> Publisher:
    """Events as the worker publishes them (the consumer takes no one else's)."""
    return await Publisher.open(worker_amqp)


@pytest.fixture(scope="module")
def sink(publisher: Publisher, topology: Topology, signer: Signer) -> TrailEmitter:
    return event_emitter(publisher, topology, signer)








async def stored(pool: asyncpg.Pool, case_id: uuid.UUID) -> list[Event]:
    rows = await CaseStore(pool).find_by_case_and_types(case_id)
    return [event_from_json(orjson.dumps({k: v for k, v in r.as_json().items()
                                          if k not in ("recordedAt", "integrity")}))
            for r in rows]


async def count_rows(pool: asyncpg.Pool, case_id: uuid.UUID, n: int) -> bool:
    return bool(await pool.fetchval(
        "SELECT count(*) = $2 FROM event_log WHERE case_id = $1", case_id, n))


async def new_case(pool: asyncpg.Pool) -> uuid.UUID:
    case_id = uuid.uuid4()
    await CaseStore(pool).insert_case(NewCase(
        case_id, "loan-officer", {}, {"provider": "scripted"}, {}, "digest", None))
    return case_id


async def test_every_event_type_round_trips_through_the_real_broker(
    consumer: EventLogConsumer, sink: TrailEmitter, pool: asyncpg.Pool
) -> None:
    terminals: list[Any] = [
        CaseCompletedPayload(cycles_completed=1, token_totals=USAGE,
                             answer={"decision": "approve", "n": [1, None]}),
        CaseFailedPayload(cycles_completed=1, token_totals=USAGE, reason_code="max_cycles",
                          message="no answer"),
        CaseTimedOutPayload(cycles_completed=1, token_totals=USAGE, deadline_seconds=1.5,
                            message="late"),
        CaseCancelledPayload(cycles_completed=1, token_totals=USAGE, while_queued=False,
                             reason="withdrawn"),
    ]
    for terminal in terminals:
        case_id = uuid.uuid4()
        sent = [started(case_id), cycle(case_id, 1, 0), make_event(case_id, 1, 2, terminal)]
        for event in sent:
            await sink.emit(event)
        await wait_until(lambda c=case_id: count_rows(pool, c, 3))
        assert await stored(pool, case_id) == sent


async def test_the_bus_carries_bytes_only(publisher: Publisher, topology: Topology) -> None:
    event = started(uuid.uuid4())
    with pytest.raises(TypeError, match="carries bytes"):
        await publisher.publish(
            topology.events_exchange, event.routing_key, event  # type: ignore[arg-type]
        )
    with pytest.raises(TypeError, match="carries bytes"):
        await publisher.publish(topology.events_exchange, event.routing_key,
                                event.model_dump())  # type: ignore[arg-type]


async def test_unroutable_publish_raises(amqp: aio_pika.abc.AbstractRobustConnection,
                                         topology: Topology) -> None:
    publisher = await Publisher.open(amqp)
    with pytest.raises(PublishRejected, match=r"NO_ROUTE|312"):
        await publisher.publish(topology.commands_exchange, "no-such-key", b"{}")
    await publisher.channel.close()


async def test_redelivery_is_stored_once_and_order_is_restored(
    consumer: EventLogConsumer, sink: TrailEmitter, pool: asyncpg.Pool, signer: Signer
) -> None:
    case_id = await new_case(pool)
    events = [started(case_id), cycle(case_id, 1, 0), cycle(case_id, 2, 1), completed(case_id, 3)]
    sealed = seal_chain(events, signer)
    for one in [sealed[2], sealed[0], sealed[3], sealed[0], sealed[1], sealed[2]]:
        await sink.out.publish_sealed(one.event, one.body, one.integrity)
    await wait_until(lambda: count_rows(pool, case_id, 4))
    await asyncio.sleep(0.3)  # any late duplicate would land by now
    assert await count_rows(pool, case_id, 4)
    assert await stored(pool, case_id) == events
    row = await CaseStore(pool).get_case(case_id)
    assert row is not None
    assert row["status"] == "completed"
    assert row["cycles"] == 2  # duplicates never count twice
    assert row["input_tokens"] == 200
    assert row["answer"] == {"decision": "approve"}


async def test_cases_status_follows_the_events(
    consumer: EventLogConsumer, sink: TrailEmitter, pool: asyncpg.Pool
) -> None:
    store = CaseStore(pool)
    case_id = await new_case(pool)
    assert (await store.get_case(case_id) or {})["status"] == "queued"
    await sink.emit(started(case_id))

    async def status_is(expected: str) -> bool:
        return (await store.get_case(case_id) or {}).get("status") == expected

    await wait_until(lambda: status_is("running"))
    await sink.emit(make_event(case_id, 1, 1, CaseFailedPayload(
        cycles_completed=0, token_totals=ZERO_USAGE, reason_code="model_error", message="401")))
    await wait_until(lambda: status_is("failed"))
    row = await store.get_case(case_id)
    assert row is not None and row["outcome"]["reasonCode"] == "model_error"


async def test_views_have_one_row_per_cycle_and_per_tool_call(
    consumer: EventLogConsumer, sink: TrailEmitter, pool: asyncpg.Pool
) -> None:
    case_id = uuid.uuid4()
    for event in [started(case_id), cycle(case_id, 1, 0, calls=3), cycle(case_id, 2, 1, calls=0),
                  completed(case_id, 3, cycles=2)]:
        await sink.emit(event)
    await wait_until(lambda: count_rows(pool, case_id, 4))
    cycles = await pool.fetch(
        "SELECT cycle_index, reasoning_text, input_tokens, tool_call_count FROM react_cycles "
        "WHERE case_id = $1 ORDER BY attempt, seq", case_id)
    assert [tuple(r) for r in cycles] == [(0, "thinking 0", 100, 3), (1, "thinking 1", 100, 0)]
    calls = await pool.fetch(
        "SELECT cycle_index, call_index, tool_name, tool_source, duration_ms, tool_result "
        "FROM react_tool_calls WHERE case_id = $1 ORDER BY seq, call_index", case_id)
    assert [tuple(r) for r in calls] == [
        (0, 0, "tool-0", "worker", 10, {"ok": 0}),
        (0, 1, "tool-1", "local", 11, {"ok": 1}),
        (0, 2, "tool-2", "worker", 12, {"ok": 2}),
    ]


async def dead_letters(amqp: aio_pika.abc.AbstractRobustConnection, topology: Topology,
                       n: int, case_id: uuid.UUID) -> list[aio_pika.abc.AbstractIncomingMessage]:
    """The first ``n`` dead letters that were on their way to ``case_id``'s routing key;
    what earlier tests left in the session's dead-letter queue is passed over."""
    channel = await amqp.channel()
    queue = await channel.get_queue(topology.dead_letter_queue, ensure=False)
    got: list[aio_pika.abc.AbstractIncomingMessage] = []
    deadline = asyncio.get_running_loop().time() + 15
    while len(got) < n and asyncio.get_running_loop().time() < deadline:
        message = await queue.get(fail=False, no_ack=True)
        if message is None:
            await asyncio.sleep(0.05)
        elif str(case_id) in str((message.headers or {}).get("x-original-routing-key")):
            got.append(message)
    await channel.close()
    return got


async def test_poison_is_dead_lettered_with_its_reason_and_neighbours_are_stored(
    consumer: EventLogConsumer, sink: TrailEmitter, publisher: Publisher,
    topology: Topology, pool: asyncpg.Pool, amqp: aio_pika.abc.AbstractRobustConnection,
    signer: Signer,
) -> None:
    case_id = uuid.uuid4()
    good = [started(case_id), cycle(case_id, 1, 0), completed(case_id, 2)]
    valid = orjson.loads(good[1].to_json())
    wrong_version = {**valid, "schemaVersion": 1}
    missing = {k: v for k, v in valid.items() if k != "occurredAt"}
    unknown = {**valid, "eventType": "CASE_EXPLODED"}
    conflict = orjson.loads(good[1].to_json())
    conflict["payload"]["reasoningText"] = "a different story"
    poison: list[tuple[bytes, str]] = [
        (b"{this is not json", "not valid JSON"),
        (orjson.dumps(wrong_version), "schemaVersion: 1 is older"),
        (orjson.dumps(missing), "occurredAt"),
        (orjson.dumps(unknown), "unknown event type"),
        (b'{"pad": "' + b"x" * 10_000_000 + b'"}', "byte limit"),
    ]
    key = f"case.default.{case_id}.REACT_CYCLE"
    await sink.emit(good[0])
    for body, _ in poison[:3]:
        await publisher.publish(topology.events_exchange, key, body)
    await sink.emit(good[1])
    for body, _ in poison[3:]:
        await publisher.publish(topology.events_exchange, key, body)
    await sink.emit(good[2])
    await wait_until(lambda: count_rows(pool, case_id, 3))
    # Other content under the same (case, attempt, seq), signed with the worker's own
    # key (a worker bug, not a forgery): stored first-write-wins, the second refused.
    first = seal_chain(good, signer)[0]
    await sink.out.publish_sealed(good[1], canonical(conflict),
                                  signer.seal(first.integrity.hash, canonical(conflict)))
    received = await dead_letters(amqp, topology, len(poison) + 1, case_id)
    assert len(received) == len(poison) + 1
    reasons = [str((m.headers or {}).get(REASON_HEADER)) for m in received]
    for (_, expected), reason in zip(poison, reasons[:-1], strict=True):
        assert expected in reason, (expected, reason)
    assert "conflict" in reasons[-1] and str(good[1].event_id) in reasons[-1]
    assert await stored(pool, case_id) == good
    assert consumer.stats.dead_lettered >= len(poison) + 1


async def test_event_messages_carry_the_designed_properties(
    amqp: aio_pika.abc.AbstractRobustConnection, sink: TrailEmitter, topology: Topology
) -> None:
    channel = await amqp.channel()
    exchange = await channel.get_exchange(topology.events_exchange, ensure=False)
    case_id = uuid.uuid4()
    queue = await channel.declare_queue(exclusive=True, auto_delete=True)
    await queue.bind(exchange, routing_key=f"case.*.{case_id}.#")
    event = started(case_id)
    await sink.emit(event)
    message = await wait_until(lambda: queue.get(no_ack=True, fail=False), timeout=10)
    assert message.body == event.to_json()
    assert message.routing_key == f"case.default.{case_id}.CASE_STARTED"
    assert message.content_type == "application/json"
    assert message.message_id == str(event.event_id)
    assert message.type == "CASE_STARTED"
    assert message.correlation_id == str(case_id)
    assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
    await channel.close()


async def test_concurrent_batches_fold_into_shared_cases_once_each(
    pool: asyncpg.Pool, signer: Signer,
) -> None:
    # Several consumers write at once: batches that touch the same cases in
    # opposite orders all commit, and each event is counted once.
    writer = EventLogWriter(pool)
    cases = [await new_case(pool) for _ in range(6)]
    rounds = 8
    batches = []
    for r in range(rounds):
        order = cases if r % 2 == 0 else list(reversed(cases))
        batches.append([SignedEvent.seal(cycle(c, r + 1, r), signer, "0" * 64)
                        for c in order])
    outcomes = await asyncio.gather(*(writer.write(batch) for batch in batches))
    assert sum(o.inserted for o in outcomes) == rounds * len(cases)
    assert all(not o.conflicts for o in outcomes)
    for case_id in cases:
        row = await CaseStore(pool).get_case(case_id)
        assert row is not None
        assert (row["status"], row["cycles"], row["input_tokens"]) == (
            "running", rounds, 100 * rounds)


async def test_an_older_batch_folded_last_never_reopens_a_waiting_case(
    pool: asyncpg.Pool, signer: Signer,
) -> None:
    """Two consumers: one folds the attempt's CASE_AWAITING_REVIEW before the other
    folds the cycles before it. The case stays awaiting review with its answer (its
    status once went back to running and stayed there)."""
    writer = EventLogWriter(pool)
    case_id = await new_case(pool)
    waiting = make_event(case_id, 1, 2, CaseAwaitingReviewPayload(
        cycles_completed=1, token_totals=USAGE, answer={"decision": "refer"},
        review_reasons=("decision",)))
    await writer.write([SignedEvent.seal(waiting, signer, "0" * 64)])
    await writer.write([SignedEvent.seal(e, signer, "0" * 64)
                        for e in (started(case_id), cycle(case_id, 1, 0))])
    row = await CaseStore(pool).get_case(case_id)
    assert row is not None
    assert (row["status"], row["answer"], row["cycles"]) == (
        "awaiting_review", {"decision": "refer"}, 1)
    # The next attempt (after a review) is later: it runs, then ends.
    await writer.write([SignedEvent.seal(started(case_id, 2), signer, "0" * 64)])
    row = await CaseStore(pool).get_case(case_id)
    assert row is not None and row["status"] == "running"


async def test_two_consumers_share_the_queue_and_store_each_event_once(
    consumer: EventLogConsumer, sink: TrailEmitter, pool: asyncpg.Pool,
    consumer_amqp: aio_pika.abc.AbstractRobustConnection, topology: Topology,
    admission: Admission, consumer_pool: asyncpg.Pool,
) -> None:
    stop, ready = asyncio.Event(), asyncio.Event()
    second = EventLogConsumer(consumer_amqp, EventLogWriter(consumer_pool), topology, admission,
                              prefetch=20,
                              batch_size=10, linger=0.002)
    task = asyncio.create_task(second.run(stop, ready))
    await asyncio.wait_for(ready.wait(), 10)
    try:
        cases = [await new_case(pool) for _ in range(10)]
        trails = {c: [started(c), *(cycle(c, i + 1, i) for i in range(5)), completed(c, 6, 5)]
                  for c in cases}
        # Interleaved across cases, as concurrent workers publish them.
        await asyncio.gather(*(sink.emit(trails[c][i]) for i in range(7) for c in cases))
        for case_id in cases:
            await wait_until(lambda c=case_id: count_rows(pool, c, 7))
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
    assert second.stats.inserted > 0  # the broker gave the second consumer its share
    for case_id in cases:
        assert await stored(pool, case_id) == trails[case_id]
        row = await CaseStore(pool).get_case(case_id)
        assert row is not None
        assert (row["status"], row["cycles"], row["input_tokens"]) == ("completed", 5, 500)
