"""Resuming from the record: a worker killed mid-case, its case taken up by the next
attempt at the first cycle the record does not hold. A real OpenAI-compatible server
counts the model requests (a scripted model would die with the worker) and the
capability worker's metrics count its tool executions."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import orjson
import pytest

from casetrail.config import ModelEndpoint, Settings
from tests.support.fake_llm import FakeLLM, Reply, fake_llm, openai_turn
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
)

TURN_SECONDS = 0.8
APPLICATION = {"applicantId": "A-7007", "applicantName": "Ada Brook", "loanAmount": 20000,
               "termMonths": 48, "monthlyIncome": 8000, "monthlyDebt": 1600,
               "purpose": "car"}


def turn_of(request: dict[str, Any]) -> int:
    """Which turn of the case a request asks for: one per observation it already has."""
    return sum(1 for m in request["messages"] if m["role"] == "tool")


def loan_model(request: dict[str, Any]) -> Reply:
    """Five turns, each one cycle: two worker tools, two local ones, then the answer."""
    def calling(name: str, **args: Any) -> Reply:
        return openai_turn(f"turn {turn_of(request)}: {name}",
                           [(f"c{turn_of(request)}", name, orjson.dumps(args).decode())])

    steps = [
        lambda: calling("credit-score", applicantId="A-7007"),
        lambda: calling("risk-model-retrieval", modelId="standard-v2", creditScore=742,
                        loanAmount=20000),
        lambda: calling("debt-to-income", monthlyDebt=1600, monthlyIncome=8000),
        lambda: calling("lending-policy", creditScore=742, dti=0.2, riskScore=0.05,
                        loanAmount=20000),
        lambda: calling("final_answer", decision="approve", applicantId="A-7007",
                        rationale="score 742, dti 0.2: policy approves", reasonCodes=[]),
    ]
    reply = steps[turn_of(request)]()
    reply.delay = TURN_SECONDS
    return reply


@pytest.fixture(scope="module")
async def llm() -> AsyncIterator[FakeLLM]:
    async with fake_llm() as server:
        server.respond = loan_model
        yield server


@pytest.fixture(scope="module")
async def resuming(settings: Settings, database: str, llm: FakeLLM
                   ) -> AsyncIterator[dict[str, Any]]:
    """API, consumer and capability worker as processes in a namespace of their own; the
    test starts (and kills) the worker."""
    endpoint = ModelEndpoint(name="fake", provider="openai", base_url=f"{llm.base_url}/v1")
    async with namespace_of_its_own(settings, "resume", model_endpoints=[endpoint]
                                    ) as (own, pool, key):
        port, capability_port = free_port(), free_port()
        children = {
            "api": spawn(own, "api", "--port", str(port)),
            "consumer": spawn(own, "consumer"),
            "capability": spawn(own, "capability-worker",
                                CASETRAIL_CAPABILITY_METRICS_PORT=str(capability_port)),
        }
        base_url = f"http://127.0.0.1:{port}"
        try:
            await wait_until(lambda: api_ready(base_url), timeout=30, interval=0.2)
            yield {"settings": own, "base_url": base_url, "pool": pool, "children": children,
                   "capability_port": capability_port,
                   "headers": {"Authorization": f"Bearer {key}"}}
            await stop_cleanly(children)
        finally:
            kill_leftovers(children)


def start_worker(resuming: dict[str, Any]) -> subprocess.Popen[bytes]:
    return replace_worker(resuming["settings"], resuming["children"])


def kill(worker: subprocess.Popen[bytes]) -> None:
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait()


async def start_case(client: httpx.AsyncClient) -> uuid.UUID:
    reply = await client.post("/cases", json={
        "agent": "loan-officer", "input": APPLICATION,
        "model": {"provider": "openai", "name": "gpt-test", "endpoint": "fake"},
        "limits": {"maxCycles": 10, "deadlineSeconds": 120}})
    assert reply.status_code == 202, reply.text
    return uuid.UUID(reply.json()["caseId"])


async def trail(pool: asyncpg.Pool, case_id: uuid.UUID) -> list[asyncpg.Record]:
    return await pool.fetch("SELECT attempt, seq, event_type, payload FROM event_log "
                            "WHERE case_id = $1 ORDER BY attempt, seq", case_id)


async def served(resuming: dict[str, Any], capability: str, outcome: str) -> float:
    return total(await scrape(resuming["capability_port"]),
                 "casetrail_tool_requests_served_total", capability=capability,
                 outcome=outcome)


def asked(llm: FakeLLM, case_input_marker: str = "A-7007") -> Counter[int]:
    return Counter(turn_of(r) for r in llm.requests
                   if case_input_marker in orjson.dumps(r["messages"]).decode())


def check_resumed_trail(rows: list[asyncpg.Record], resumed_cycles: int) -> None:
    """Attempt 2 carried ``resumed_cycles`` over and continued the cycle index; nothing
    recorded twice; the totals count every cycle once."""
    by_attempt: dict[int, list[asyncpg.Record]] = {}
    for row in rows:
        by_attempt.setdefault(row["attempt"], []).append(row)
    assert set(by_attempt) == {1, 2}
    started = by_attempt[2][0]
    assert started["event_type"] == "CASE_STARTED"
    assert started["payload"]["resumedFrom"] == {
        "attempt": 1, "seq": by_attempt[1][-1]["seq"], "cycles": resumed_cycles}
    indexes = [r["payload"]["cycleIndex"] for r in rows if r["event_type"] == "REACT_CYCLE"]
    assert indexes == list(range(5))  # attempt 1's, then attempt 2's: each cycle once
    assert [r["payload"]["cycleIndex"] for r in by_attempt[2]
            if r["event_type"] == "REACT_CYCLE"] == list(range(resumed_cycles, 5))
    terminal = by_attempt[2][-1]
    assert terminal["event_type"] == "CASE_COMPLETED"
    assert terminal["payload"]["cyclesCompleted"] == 5
    cycles = [r["payload"] for r in rows if r["event_type"] == "REACT_CYCLE"]
    assert terminal["payload"]["tokenTotals"] == {
        "inputTokens": sum(c["tokenUsage"]["inputTokens"] for c in cycles),
        "outputTokens": sum(c["tokenUsage"]["outputTokens"] for c in cycles)}


async def test_a_worker_killed_after_cycle_two_resumes_at_cycle_three(
    resuming: dict[str, Any], llm: FakeLLM,
) -> None:
    pool = resuming["pool"]
    llm.requests.clear()
    worker = start_worker(resuming)
    before = {c: await served(resuming, c, "ok") for c in ("credit-score",
                                                          "risk-model-retrieval")}
    async with httpx.AsyncClient(base_url=resuming["base_url"],
                                 headers=resuming["headers"]) as client:
        case_id = await start_case(client)

        async def two_cycles_recorded() -> bool:
            rows = await trail(pool, case_id)
            return bool(sum(r["event_type"] == "REACT_CYCLE" for r in rows) >= 2)
        await wait_until(two_cycles_recorded, timeout=30, interval=0.05)
        kill(worker)  # while the model thinks about the third turn
        resuming["children"].pop("worker")
        start_worker(resuming)
        case = await ended(client, case_id, timeout=60)
    assert case["status"] == "completed" and case["attempts"] == 2
    assert case["answer"]["decision"] == "approve"
    assert case["cycles"] == 5  # the fold counted every cycle once
    check_resumed_trail(await trail(pool, case_id), resumed_cycles=2)

    counts = asked(llm)
    assert counts[0] == counts[1] == 1, counts  # recorded turns were not asked again
    assert counts[2] in (1, 2) and counts[3] == counts[4] == 1, counts  # 2 was cut short
    for capability in ("credit-score", "risk-model-retrieval"):
        assert await served(resuming, capability, "ok") - before[capability] == 1


async def test_a_worker_killed_between_a_model_turn_and_its_tool_call_resumes(
    resuming: dict[str, Any], llm: FakeLLM,
) -> None:
    """The second turn asks for a worker tool; the worker dies while the capability
    worker holds the request. The cycle runs again: its model turn is asked again, and
    the tool call, under the same idempotency key, is answered from memory."""
    pool = resuming["pool"]
    llm.requests.clear()
    capability: subprocess.Popen[bytes] = resuming["children"]["capability"]
    worker = start_worker(resuming)
    before = {o: await served(resuming, "risk-model-retrieval", o) for o in ("ok", "remembered")}
    async with httpx.AsyncClient(base_url=resuming["base_url"],
                                 headers=resuming["headers"]) as client:
        case_id = await start_case(client)

        async def second_turn_answered() -> bool:
            return bool(asked(llm)[1] >= 1)
        await wait_until(second_turn_answered, timeout=30, interval=0.02)
        capability.send_signal(signal.SIGSTOP)  # the tool request waits in its queue
        try:
            await asyncio.sleep(TURN_SECONDS + 0.3)  # the turn is answered, the call sent
            kill(worker)
        finally:
            capability.send_signal(signal.SIGCONT)
        resuming["children"].pop("worker")
        start_worker(resuming)
        case = await ended(client, case_id, timeout=60)
    assert case["status"] == "completed" and case["attempts"] == 2
    check_resumed_trail(await trail(pool, case_id), resumed_cycles=1)
    counts = asked(llm)
    assert counts[0] == 1 and counts[1] == 2, counts  # the cut-short cycle's turn, again
    after = {o: await served(resuming, "risk-model-retrieval", o) for o in ("ok", "remembered")}
    assert after["ok"] - before["ok"] == 1  # the tool ran once...
    assert after["remembered"] - before["remembered"] == 1  # ...and answered twice
