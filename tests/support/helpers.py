"""Small shared pieces for tests: an in-memory event sink (the engine's own
interface, not a stand-in for the bus) and ways to build specs."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import aio_pika

from casetrail.adapters.bus.dead_letter import REASON_HEADER
from casetrail.adapters.bus.topology import Topology
from casetrail.agents import AGENTS, CAPABILITIES, registry
from casetrail.contract.events import Event, Limits, ModelRef
from casetrail.engine.case import CaseSpec
from casetrail.engine.tools import InProcessWorkerRuntime, ToolBox, ToolSource

CapabilityConnections = Callable[[str], Awaitable[aio_pika.abc.AbstractRobustConnection]]
"""The ``capability_as`` fixture: a broker connection as one capability's own user."""


class ListSink:
    """Collects emitted events in order."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    async def emit(self, event: Event) -> None:
        self.events.append(event)
        await asyncio.sleep(0)  # yields, as a real sink waiting for a confirm does

    @property
    def types(self) -> list[str]:
        return [e.event_type for e in self.events]


def spec_for(
    case_input: dict[str, Any],
    *,
    agent: str = "loan-officer",
    max_cycles: int = 8,
    deadline: float = 30.0,
    attempt: int = 1,
    typed: bool = True,
    review: bool = True,
) -> CaseSpec:
    """A case of ``agent`` (its typed answer and checks unless ``typed`` is false; the
    answers a person decides, unless ``review`` is false)."""
    profile = AGENTS[agent]
    answering = profile.answering
    if answering is not None and not review:
        answering = replace(answering, review=None)
    return CaseSpec(
        case_id=uuid.uuid4(),
        attempt=attempt,
        agent=agent,
        system_prompt=profile.system_prompt,
        input=case_input,
        limits=Limits(max_cycles=max_cycles, deadline_seconds=deadline),
        model=ModelRef(provider="scripted", name="test"),
        answering=answering if typed else None,
    )


def toolbox(tools: tuple[ToolSource, ...] | None = None) -> ToolBox:
    return ToolBox(tools or AGENTS["loan-officer"].tools, InProcessWorkerRuntime(CAPABILITIES))


async def wait_until(check: Any, timeout: float = 15.0, interval: float = 0.05) -> Any:
    """Poll the async ``check`` until it returns something truthy; fail after ``timeout``."""
    import asyncio

    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = await check()
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last value {value!r})")
        await asyncio.sleep(interval)


async def ended(client: Any, case_id: str | Any, timeout: float = 20,
                statuses: tuple[str, ...] = ()) -> dict[str, Any]:
    """Poll ``GET /cases/{id}`` (an httpx client) until the case has ended or waits for a
    person (or is past ``statuses`` too); its view."""
    async def check() -> dict[str, Any] | None:
        body: dict[str, Any] = (await client.get(f"/cases/{case_id}")).json()
        return body if body["status"] not in ("queued", "running", *statuses) else None

    result: dict[str, Any] = await wait_until(check, timeout)
    return result


async def wait_for_sql(pool: Any, sql: str, *args: Any, timeout: float = 15.0) -> None:
    """Poll until the single value ``sql`` selects is truthy; fail after ``timeout``."""

    async def check() -> bool:
        return bool(await pool.fetchval(sql, *args))

    await wait_until(check, timeout)


async def drain(queue: aio_pika.abc.AbstractQueue, count: int
                ) -> list[aio_pika.abc.AbstractIncomingMessage]:
    """``count`` messages from ``queue`` (no ack), within 10 s."""
    got: list[aio_pika.abc.AbstractIncomingMessage] = []
    async with asyncio.timeout(10):
        while len(got) < count:
            message = await queue.get(no_ack=True, fail=False)
            if message is None:
                await asyncio.sleep(0.02)
            else:
                got.append(message)
    return got


async def dead_letter_for(amqp: aio_pika.abc.AbstractRobustConnection, topology: Topology,
                          message_id: str) -> str:
    """The reason the consumer gave for setting ``message_id`` aside (other dead letters
    are left to the tests that wait for them)."""
    channel = await amqp.channel()
    queue = await channel.get_queue(topology.dead_letter_queue, ensure=False)
    deadline = asyncio.get_running_loop().time() + 15
    try:
        while asyncio.get_running_loop().time() < deadline:
            message = await queue.get(fail=False, no_ack=False)
            if message is None:
                await asyncio.sleep(0.05)
                continue
            if message.message_id == message_id:
                await message.ack()
                return str((message.headers or {}).get(REASON_HEADER))
            await message.nack(requeue=True)
        raise AssertionError(f"no dead letter for {message_id}")
    finally:
        await channel.close()


@contextmanager
def registered(agent: Any) -> Iterator[str]:
    """A test's own agent in the registry every component of the in-process stack
    reads, for the duration; yields its name."""
    found = registry()
    found.add(agent, "tests")
    try:
        yield agent.name
    finally:
        found.agents.pop(agent.name)
        found.origins.pop(f"agent:{agent.name}")
