"""Raw limits of this machine, measured in the same run: persistent publish with
confirms into a quorum queue, consume with batched acks, asyncpg COPY of event rows."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any

import aiormq
import asyncpg

from casetrail.adapters.bus.fastpath import ConfirmedChannel
from casetrail.adapters.bus.properties import Properties
from casetrail.config import Settings
from casetrail.contract.events import (
    Event,
    ReactCyclePayload,
    TokenUsage,
    ToolCallRecord,
    event_payload_json,
    make_event,
    new_case_id,
)


def sample_cycles(count: int, case_id: uuid.UUID | None = None) -> list[Event]:
    """``count`` realistic REACT_CYCLE events (two tool calls each)."""
    case_id = case_id or new_case_id()
    calls = (
        ToolCallRecord(tool_name="credit-score", tool_args={"applicantId": "A-1001"},
                       tool_result={"score": 742, "bureau": "Equinox"}, tool_source="worker",
                       duration=timedelta(milliseconds=14), tool_call_id="call-1"),
        ToolCallRecord(tool_name="debt-to-income",
                       tool_args={"monthlyDebt": 2100, "monthlyIncome": 9000},
                       tool_result={"dti": 0.233}, tool_source="local",
                       duration=timedelta(milliseconds=1), tool_call_id="call-2"),
    )
    return [
        make_event(case_id, 1, i, ReactCyclePayload(
            cycle_index=i,
            reasoning_text="The credit score is 742. I should now retrieve the risk model "
                           "(standard-v2) and compute the debt-to-income ratio.",
            tool_calls=calls, token_usage=TokenUsage(input_tokens=1240, output_tokens=89),
            model="bench", finish_reason="tool_calls"))
        for i in range(count)
    ]


async def publish_all(channel: aiormq.abc.AbstractChannel, queue: str,
                      bodies: list[bytes], in_flight: int) -> None:
    """``bodies`` published persistent into ``queue``, each confirmed, ``in_flight``
    unconfirmed at most: the same confirmed-publish path casetrail's publisher uses, so
    the ceiling is the broker's, not a slower client's."""
    confirmed = ConfirmedChannel(channel)
    gate = asyncio.Semaphore(in_flight)

    async def one(i: int, body: bytes) -> None:
        async with gate:
            await confirmed.publish("", queue, body, Properties(message_id=str(i)))

    await asyncio.gather(*(one(i, b) for i, b in enumerate(bodies)))


def acking_in_batches(channel: aiormq.abc.AbstractChannel, count: int, batch: int
                      ) -> tuple[Callable[[aiormq.abc.DeliveredMessage],
                                          Coroutine[Any, Any, None]],
                                 asyncio.Event]:
    """A consumer's callback that acks every ``batch`` messages with one multiple ack
    (and the last), as the event-log consumer does, and the event set once ``count``
    have arrived."""
    consumed = 0
    done = asyncio.Event()

    async def on_message(message: aiormq.abc.DeliveredMessage) -> None:
        nonlocal consumed
        consumed += 1
        if consumed % batch == 0 or consumed == count:
            await channel.basic_ack(message.delivery_tag or 0, multiple=True)
        if consumed == count:
            done.set()

    return on_message, done


async def publish_confirmed(settings: Settings, count: int, in_flight: int = 1000
                            ) -> dict[str, Any]:
    bodies = [e.to_json() for e in sample_cycles(count)]
    queue = f"{settings.namespace}.raw-{uuid.uuid4().hex[:6]}"
    connection = await aiormq.connect(settings.amqp_url)
    channel = await connection.channel(publisher_confirms=True)
    await channel.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
    started, cpu_started = time.perf_counter(), time.process_time()
    await publish_all(channel, queue, bodies, in_flight)
    published = count / (time.perf_counter() - started)
    client_cpu = (time.process_time() - cpu_started) / count

    await channel.basic_qos(prefetch_count=2000)
    on_message, done = acking_in_batches(channel, count, 500)
    started = time.perf_counter()
    consuming = await channel.basic_consume(queue, on_message)
    await asyncio.wait_for(done.wait(), 300)
    consume_rate = count / (time.perf_counter() - started)
    await channel.basic_cancel(consuming.consumer_tag or "")
    await channel.queue_delete(queue)
    await connection.close()
    return {"messages": count, "bodyBytes": len(bodies[0]),
            "publishConfirmedPerSecond": round(published),
            "publishClientMicroseconds": round(client_cpu * 1e6, 1),
            "consumePerSecond": round(consume_rate)}


async def copy_rows(settings: Settings, count: int) -> dict[str, Any]:
    events = sample_cycles(count)
    conn = await asyncpg.connect(settings.database_url)
    try:
        # COPY in binary needs a binary jsonb codec: a version byte, then the text.
        await conn.set_type_codec("jsonb", schema="pg_catalog", format="binary",
                                  encoder=lambda v: b"\x01" + v, decoder=lambda v: v[1:])
        await conn.execute("CREATE TEMP TABLE copy_target (LIKE event_log INCLUDING DEFAULTS)")
        now = datetime.now(UTC)
        records = [(e.event_id, e.case_id, e.attempt, e.seq, e.event_type, e.occurred_at, now,
                    1, event_payload_json(e)) for e in events]
        started = time.perf_counter()
        await conn.copy_records_to_table(
            "copy_target", records=records,
            columns=["event_id", "case_id", "attempt", "seq", "event_type", "occurred_at",
                     "recorded_at", "schema_version", "payload"])
        rate = count / (time.perf_counter() - started)
    finally:
        await conn.close()
    return {"rows": count, "copyRowsPerSecond": round(rate)}
