"""WorkerTools over the real RabbitMQ: retries, timeouts, validation, a dying worker,
and many concurrent calls each answered once to its own caller."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aio_pika
import pytest
from pydantic import BaseModel

from casetrail.adapters.bus.publisher import Publisher
from casetrail.adapters.bus.rpc import BusWorkerRuntime, RetryPolicy
from casetrail.adapters.bus.topology import Topology
from casetrail.agents import CAPABILITIES
from casetrail.components.capability_worker import CapabilityWorker
from casetrail.config import Settings
from casetrail.engine.chat import ToolCallRequest
from casetrail.engine.tools import Capability, ToolBox, WorkerTool
from tests.support.helpers import CapabilityConnections


class Echo(BaseModel):
    text: str


@pytest.fixture(scope="module")
async def runtime(
    worker_amqp: aio_pika.abc.AbstractRobustConnection, topology: Topology, settings: Settings,
) -> AsyncIterator[BusWorkerRuntime]:
    rpc = BusWorkerRuntime(
        worker_amqp, topology, await Publisher.open(worker_amqp),
        settings.capability_user,
        default_policy=RetryPolicy(attempts=2, timeout_seconds=2.0),
        policies={
            "nobody-home": RetryPolicy(attempts=2, timeout_seconds=0.3, backoff_initial=0.05),
            "slow-echo": RetryPolicy(attempts=3, timeout_seconds=1.5, backoff_initial=0.05),
        },
    )
    await rpc.start()
    yield rpc
    await rpc.close()


class RunningWorker:
    def __init__(self, worker: CapabilityWorker, task: asyncio.Task[None],
                 stop: asyncio.Event) -> None:
        self.worker, self.task, self.stop = worker, task, stop

    async def close(self) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, 10)


async def start_worker(connection: aio_pika.abc.AbstractRobustConnection, topology: Topology,
                       capabilities: list[Capability[Any]], name: str) -> RunningWorker:
    stop, ready = asyncio.Event(), asyncio.Event()
    worker = CapabilityWorker(connection, topology, capabilities, concurrency=32, name=name)
    task = asyncio.create_task(worker.run(stop, ready))
    await asyncio.wait_for(ready.wait(), 10)
    return RunningWorker(worker, task, stop)


async def test_a_normal_call_and_its_record(
    runtime: BusWorkerRuntime, capability_as: CapabilityConnections, topology: Topology,
) -> None:
    worker = await start_worker(await capability_as("credit-score"), topology,
                                [CAPABILITIES["credit-score"]], "w1")
    try:
        tool = WorkerTool("credit-score", "score", "credit-score",
                          CAPABILITIES["credit-score"].args_model)
        box = ToolBox([tool], runtime)
        outcome = await box.run(ToolCallRequest("c1", "credit-score", {"applicantId": "A-1001"}),
                                key=str(uuid.uuid4()))
        record = outcome.record
        assert record.error is None
        assert record.tool_result == {"applicantId": "A-1001", "score": 742, "bureau": "Equinox"}
        assert record.tool_source == "worker"
        assert [(a.attempt, a.outcome, a.worker) for a in record.attempts] == [(1, "ok", "w1")]
        assert record.duration >= record.attempts[0].duration

        bad = await runtime.execute("credit-score", {"applicantId": "nope"},
                                    call_id=str(uuid.uuid4()))
        assert bad.error is not None and "invalid arguments: applicantId" in bad.error
        assert [a.outcome for a in bad.attempts] == ["error"]  # not retried: it cannot succeed
    finally:
        await worker.close()


async def test_no_live_worker_times_out_per_policy(runtime: BusWorkerRuntime) -> None:
    result = await runtime.execute("nobody-home", {"x": 1}, call_id=str(uuid.uuid4()))
    assert result.error is not None
    assert "nobody-home failed after 2 attempts; last: timeout" in result.error
    assert [a.outcome for a in result.attempts] == ["timeout", "timeout"]


async def test_a_worker_dying_mid_call_is_retried_on_another(
    runtime: BusWorkerRuntime, settings: Settings, topology: Topology,
    capability_as: CapabilityConnections,
) -> None:
    received = asyncio.Queue[int]()

    async def hang(args: Echo) -> str:
        received.put_nowait(1)
        await asyncio.Event().wait()  # never answers: this worker is about to die
        return args.text

    async def echo(args: Echo) -> str:
        return args.text.upper()

    # Not robust: it stays dead.
    doomed_connection = await aio_pika.connect(settings.capability_identity("slow-echo").amqp_url)
    doomed = await start_worker(doomed_connection, topology,  # type: ignore[arg-type]
                                [Capability("slow-echo", Echo, hang)], "doomed")
    call = asyncio.create_task(
        runtime.execute("slow-echo", {"text": "hello"}, call_id=str(uuid.uuid4()))
    )
    await asyncio.wait_for(received.get(), 5)  # attempt 1 is on the doomed worker
    await asyncio.wait_for(received.get(), 5)  # attempt 2 (after a timeout) too
    await doomed_connection.close()  # the worker dies holding both, unacknowledged
    doomed.task.cancel()
    rescuer = await start_worker(await capability_as("slow-echo"), topology,
                                 [Capability("slow-echo", Echo, echo)], "rescuer")
    try:
        result = await asyncio.wait_for(call, 10)
    finally:
        await rescuer.close()
    assert result.result == "HELLO", result
    assert [(a.attempt, a.outcome) for a in result.attempts] == [(1, "timeout"), (2, "ok")]
    assert result.attempts[-1].worker == "rescuer"


async def test_a_call_that_may_run_once_is_refused_when_it_comes_back_from_a_dead_worker(
    runtime: BusWorkerRuntime, settings: Settings, topology: Topology,
    capability_as: CapabilityConnections,
) -> None:
    """A tool that may not run twice (an MCP tool the server does not annotate read-only
    or idempotent): sent once, and when the worker that held it dies, the broker's
    second delivery is refused, not run."""
    received = asyncio.Queue[int]()
    ran: list[str] = []

    async def hang(args: Echo) -> str:
        received.put_nowait(1)
        await asyncio.Event().wait()
        return args.text

    async def run_once(args: Echo) -> str:
        ran.append(args.text)
        return args.text

    doomed_connection = await aio_pika.connect(settings.capability_identity("slow-echo").amqp_url)
    doomed = await start_worker(doomed_connection, topology,  # type: ignore[arg-type]
                                [Capability("slow-echo", Echo, hang)], "doomed")
    call = asyncio.create_task(runtime.execute("slow-echo", {"text": "transfer"},
                                               call_id=str(uuid.uuid4()), retry=False))
    await asyncio.wait_for(received.get(), 5)
    await doomed_connection.close()  # dies holding it: the broker hands it out again
    doomed.task.cancel()
    careful = await start_worker(await capability_as("slow-echo"), topology, [Capability(
        "slow-echo", Echo, run_once, at_most_once=lambda args: True)], "careful")
    try:
        result = await asyncio.wait_for(call, 10)
    finally:
        await careful.close()
    assert ran == []
    assert len(result.attempts) == 1, result  # never sent twice
    assert result.error is not None and "may run at most once" in result.error, result
    assert result.attempts[0].worker == "careful"


async def test_a_capability_says_which_replies_are_kept_for_retries(
    runtime: BusWorkerRuntime, capability_as: CapabilityConnections, topology: Topology,
) -> None:
    """A request sent again under its key is answered from memory when its capability
    keeps that kind of reply; a kind it does not keep (a catalog read) runs again and
    takes no place in the memory."""
    ran: list[str] = []

    async def echo(args: Echo) -> str:
        ran.append(args.text)
        return f"{args.text} {len(ran)}"

    worker = await start_worker(await capability_as("slow-echo"), topology, [Capability(
        "slow-echo", Echo, echo, remembered=lambda args: args["text"] != "catalog")], "w1")
    try:
        kept = [await runtime.execute("slow-echo", {"text": "call"}, call_id="k-call")
                for _ in range(2)]
        fresh = [await runtime.execute("slow-echo", {"text": "catalog"}, call_id="k-catalog")
                 for _ in range(2)]
    finally:
        await worker.close()
    assert [r.result for r in kept] == ["call 1", "call 1"]
    assert [r.result for r in fresh] == ["catalog 2", "catalog 3"]
    assert ran == ["call", "catalog", "catalog"]
    assert [key for _, _, key in worker.worker._answers] == ["k-call"]


async def test_two_hundred_concurrent_calls_across_two_workers(
    runtime: BusWorkerRuntime, capability_as: CapabilityConnections, topology: Topology,
) -> None:
    capability = CAPABILITIES["risk-model-retrieval"]
    workers = [await start_worker(await capability_as(capability.name), topology, [capability],
                                  f"w{i}")
               for i in range(2)]
    try:
        calls = [
            runtime.execute("risk-model-retrieval",
                            {"modelId": "standard-v2", "creditScore": 500 + i, "loanAmount": 1000},
                            call_id=str(uuid.uuid4()))
            for i in range(200)
        ]
        results = await asyncio.gather(*calls)
    finally:
        for worker in workers:
            await worker.close()
    for i, result in enumerate(results):
        expected = await capability.invoke(
            {"modelId": "standard-v2", "creditScore": 500 + i, "loanAmount": 1000})
        assert result.result == expected
        assert len(result.attempts) == 1 and result.attempts[0].outcome == "ok"
    served = [w.worker.served for w in workers]
    assert sum(served) == 200
    assert all(n > 0 for n in served), served
