"""A task followed as it runs (A2A's ``SendStreamingMessage`` and ``SubscribeToTask``):
built on the case's own event stream (service/api/streams.py), so it has neither a gap
nor a duplicate, and resumable: a subscriber gets the task as it is now, then a status
update for each event after it (a cycle recorded, a wait for a person, a review), then
the task once it has ended, with its artifacts. A status message carries counts,
reasons and codes, never a sensitive value."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import orjson
from a2a.server.events.event_queue import Event
from a2a.types.a2a_pb2 import (
    Message,
    Part,
    Role,
    Task,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from a2a.utils.errors import InternalError

from casetrail.adapters.bus.watch import EventWatch
from casetrail.api.a2a_tasks import ENDED, WAITS
from casetrail.api.streams import StreamSlots, TooManyStreams, case_stream
from casetrail.contract.events import TERMINAL_EVENT_TYPES

SETTLE_SECONDS = 5.0
"""How long the last task waits for the case's row to show the end its terminal event
says (the consumer folds the event in after publishing it)."""


@dataclass(frozen=True)
class Following:
    """What following a case needs from the API: its event watch, the stream slots, the
    store, how often to ping, whether the credential still works."""

    watch: EventWatch
    slots: StreamSlots
    store: Any
    ping_seconds: float
    still_allowed: Callable[[], Awaitable[bool]]


def _said(event_type: str, envelope: dict[str, Any]) -> str:
    payload = envelope.get("payload") or {}
    if event_type == "REACT_CYCLE":
        calls = len(payload.get("toolCalls") or ())
        return f"cycle {payload.get('cycleIndex', '?')} recorded ({calls} tool calls)"
    if event_type == "CASE_STARTED":
        return f"started (attempt {envelope.get('attempt', 1)})"
    if event_type == "CASE_AWAITING_REVIEW":
        return f"waiting for {WAITS.get(payload.get('reason', 'decision'), 'a person')}"
    if event_type == "CASE_REVIEWED":
        return f"reviewed: {payload.get('verdict', 'decided')}"
    return event_type.removeprefix("CASE_").replace("_", " ").lower()


async def follow(task: Task, following: Following, subject: str, tenant: str,
                 current: Callable[[], Awaitable[Task]]) -> AsyncGenerator[Event]:
    """``task`` (as it is now), then a status update an event, then the ended task
    (``current`` reads it)."""
    yield task
    if task.status.state in ENDED:
        return
    case_id = uuid.UUID(task.id)
    try:
        ticket = following.slots.take(subject, tenant)
    except TooManyStreams as exc:
        raise InternalError(f"{exc}: poll GetTask instead") from None
    head = await following.store.trail_head(case_id)
    after = None if head is None else (head.attempt, head.seq)
    with ticket:
        async with aclosing(case_stream(following.watch, following.store, case_id, after,
                                        False, {}, following.ping_seconds,
                                        following.still_allowed)) as messages:
            async for message in messages:
                if message.event is None:  # a keep-alive
                    continue
                if message.event in TERMINAL_EVENT_TYPES:
                    break
                envelope = orjson.loads(message.data)
                yield TaskStatusUpdateEvent(
                    task_id=task.id, context_id=task.context_id, status=TaskStatus(
                        state=TaskState.TASK_STATE_WORKING, message=Message(
                            message_id=f"{task.id}:{message.id}", role=Role.ROLE_AGENT,
                            task_id=task.id, context_id=task.context_id,
                            parts=[Part(text=_said(message.event, envelope))])))
    yield await _settled(current)


async def _settled(current: Callable[[], Awaitable[Task]]) -> Task:
    """The task once its row shows the end (or as it is after ``SETTLE_SECONDS``)."""
    deadline = asyncio.get_running_loop().time() + SETTLE_SECONDS
    while True:
        task = await current()
        if task.status.state in ENDED or asyncio.get_running_loop().time() > deadline:
            return task
        await asyncio.sleep(0.05)
