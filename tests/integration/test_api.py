"""The REST API over real HTTP (uvicorn), with the worker, consumer and capability
worker running against the real RabbitMQ and Postgres."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from http import HTTPStatus
from typing import Any

import aio_pika
import asyncpg
import httpx
import orjson
import pytest

from casetrail.agents.loan_officer import SAMPLE_APPLICATIONS
from casetrail.config import Settings
from tests.support.helpers import ended, wait_until
from tests.support.stack import InProcessStack, module_stack

APPROVE = SAMPLE_APPLICATIONS[0]
CYCLE_KEYS = ["cycleIndex", "reasoningText", "toolCalls", "tokenUsage"]
CALL_KEYS = ["toolName", "toolArgs", "toolResult", "toolSource", "durationMs"]


# One case at a time, so a slow case keeps the next one queued on purpose.
stack = module_stack(worker_concurrency=1)


async def start(client: httpx.AsyncClient, case_input: dict[str, Any] = APPROVE,
                **extra: Any) -> str:
    reply = await client.post("/cases", json={"agent": "loan-officer", "input": case_input,
                                              **extra})
    assert reply.status_code == 202, reply.text
    assert reply.json()["status"] == "queued"
    case_id: str = reply.json()["caseId"]
    return case_id


async def test_a_loan_case_runs_end_to_end_and_its_trail_is_exact(
    client: httpx.AsyncClient, amqp: aio_pika.abc.AbstractRobustConnection,
    settings: Settings, pool: asyncpg.Pool,
) -> None:
    channel = await amqp.channel()
    exchange = await channel.get_exchange(f"{settings.namespace}.events", ensure=False)
    subscriber = await channel.declare_queue(exclusive=True, auto_delete=True)
    await subscriber.bind(exchange, routing_key="case.*.*.REACT_CYCLE")

    case_id = await start(client)
    case = await ended(client, case_id)
    assert case["status"] == "completed"
    assert case["answer"]["decision"] == "approve"
    assert case["cycles"] == 4 and case["attempts"] == 1
    assert case["tokenUsage"]["inputTokens"] > 0

    trail = (await client.get(f"/cases/{case_id}/events")).json()["events"]
    assert [e["seq"] for e in trail] == list(range(len(trail)))
    assert [e["eventType"] for e in trail] == (
        ["CASE_STARTED"] + ["REACT_CYCLE"] * 4 + ["CASE_COMPLETED"]
    )
    cycles = [e["payload"] for e in trail if e["eventType"] == "REACT_CYCLE"]
    for cycle in cycles:
        assert set(CYCLE_KEYS) <= set(cycle)
        for call in cycle["toolCalls"]:
            assert set(CALL_KEYS) <= set(call) and "error" not in call
            assert isinstance(call["durationMs"], int)
    sources = {c["toolName"]: c["toolSource"] for cy in cycles for c in cy["toolCalls"]}
    assert sources == {"credit-score": "worker", "risk-model-retrieval": "worker",
                       "debt-to-income": "local", "lending-policy": "local"}
    filtered = (await client.get(f"/cases/{case_id}/events",
                                 params={"types": "REACT_CYCLE,CASE_COMPLETED"})).json()["events"]
    assert [e["eventType"] for e in filtered] == ["REACT_CYCLE"] * 4 + ["CASE_COMPLETED"]
    status = await pool.fetchval("SELECT status FROM cases WHERE case_id = $1",
                                 uuid.UUID(case_id))
    assert status == "completed"

    heard: list[dict[str, Any]] = []
    while len(heard) < 4:
        message = await subscriber.get(timeout=5, fail=False, no_ack=True)
        assert message is not None, f"subscriber heard only {len(heard)} cycles"
        event = orjson.loads(message.body)
        if event["caseId"] == case_id:
            heard.append(event["payload"])
    assert heard == cycles
    await channel.close()


async def count_cases(pool: asyncpg.Pool) -> int:
    value: int = await pool.fetchval("SELECT count(*) FROM cases")
    return value


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        ({"agent": "astrologer", "input": {}}, 422,
         "the agents are: aml-screening, loan-officer, throughput-probe"),
        ({"agent": "loan-officer", "input": {**APPROVE, "loanAmount": -5, "termMonths": "x"}},
         422, "loanAmount"),
        ({"agent": "loan-officer", "input": APPROVE, "limits": {"maxCycles": 500}}, 422,
         "must be at most 50"),
        ({"agent": "loan-officer", "input": APPROVE, "limits": {"deadlineSeconds": 99999}}, 422,
         "deadlineSeconds"),
        ({"agent": "loan-officer"}, 422, "input"),
        ({"agent": "loan-officer", "input": APPROVE, "surprise": 1}, 422, "surprise"),
    ],
)
async def test_bad_case_requests_are_refused_and_leave_nothing(
    client: httpx.AsyncClient, pool: asyncpg.Pool, body: dict[str, Any], status: int, says: str
) -> None:
    before = await count_cases(pool)
    reply = await client.post("/cases", json=body)
    assert reply.status_code == status
    assert says in reply.text
    assert await count_cases(pool) == before


async def test_schema_errors_name_each_field(client: httpx.AsyncClient) -> None:
    bad = {**APPROVE, "loanAmount": -5, "termMonths": "x"}
    reply = await client.post("/cases", json={"agent": "loan-officer", "input": bad})
    problem = reply.json()  # RFC 9457: a problem, each field in its errors
    assert reply.headers["content-type"] == "application/problem+json"
    assert problem["status"] == 422 and problem["title"] == HTTPStatus(422).phrase
    fields = {tuple(d["loc"]) for d in problem["errors"]}
    assert "input.loanAmount" in problem["detail"]
    assert ("body", "input", "loanAmount") in fields
    assert ("body", "input", "termMonths") in fields


async def test_malformed_and_oversized_bodies(client: httpx.AsyncClient,
                                              pool: asyncpg.Pool) -> None:
    before = await count_cases(pool)
    reply = await client.post("/cases", content=b"{not json",
                              headers={"content-type": "application/json"})
    assert reply.status_code == 422 and "JSON" in reply.text
    huge = {"agent": "loan-officer", "input": {**APPROVE, "purpose": "x" * 400_000}}
    reply = await client.post("/cases", json=huge)
    assert reply.status_code == 413
    assert await count_cases(pool) == before


async def test_unknown_and_malformed_case_ids(client: httpx.AsyncClient) -> None:
    missing = uuid.uuid4()
    assert (await client.get(f"/cases/{missing}")).status_code == 404
    assert (await client.get(f"/cases/{missing}/events")).status_code == 404
    assert (await client.post(f"/cases/{missing}/cancel")).status_code == 404
    assert (await client.get("/cases/not-a-uuid")).status_code == 422
    reply = await client.get(f"/cases/{missing}/events", params={"types": "REACT_CYCLE,NOPE"})
    assert reply.status_code == 422 and "NOPE" in reply.text


async def test_idempotency_key_returns_the_same_case(client: httpx.AsyncClient,
                                                     pool: asyncpg.Pool) -> None:
    key = {"Idempotency-Key": f"retry-{uuid.uuid4()}"}
    body = {"agent": "loan-officer", "input": SAMPLE_APPLICATIONS[1]}
    first = await client.post("/cases", json=body, headers=key)
    second = await client.post("/cases", json=body, headers=key)
    assert first.status_code == second.status_code == 202
    assert first.json()["caseId"] == second.json()["caseId"]
    assert second.headers["Idempotency-Replayed"] == "true"
    other = await client.post("/cases", json={**body, "input": APPROVE}, headers=key)
    assert other.status_code == 409
    rows = await pool.fetchval("SELECT count(*) FROM cases WHERE idempotency_key = $1",
                               key["Idempotency-Key"])
    assert rows == 1
    case = await ended(client, first.json()["caseId"])
    assert case["answer"]["decision"] == "refer"
    trail = (await client.get(f"/cases/{first.json()['caseId']}/events")).json()["events"]
    assert sum(e["eventType"] == "CASE_STARTED" for e in trail) == 1


async def test_cancel_while_running_and_while_queued(client: httpx.AsyncClient) -> None:
    slow = {"model": {"provider": "scripted", "name": "slow", "latencyMs": 2000}}
    running = await start(client, **slow)
    queued = await start(client)  # the worker runs one case at a time: this one waits

    async def is_running() -> bool:
        status: str = (await client.get(f"/cases/{running}")).json()["status"]
        return status == "running"

    await wait_until(is_running)
    # Only the worker emits case events: the queued case is cancelled by the worker
    # that receives its start command, without running it.
    reply = await client.post(f"/cases/{queued}/cancel", json={"reason": "applicant withdrew"})
    assert reply.status_code == 202 and reply.json()["status"] == "cancelling"
    reply = await client.post(f"/cases/{running}/cancel", json={"reason": "duplicate"})
    assert reply.status_code == 202 and reply.json()["status"] == "cancelling"

    for case_id, while_queued, reason in [(running, False, "duplicate"),
                                          (queued, True, "applicant withdrew")]:
        case = await ended(client, case_id)
        assert case["status"] == "cancelled"
        trail = (await client.get(f"/cases/{case_id}/events")).json()["events"]
        terminal = trail[-1]
        assert terminal["eventType"] == "CASE_CANCELLED"
        assert terminal["payload"]["whileQueued"] is while_queued
        assert terminal["payload"]["reason"] == reason
        assert sum(e["eventType"].startswith("CASE_") and e["eventType"] != "CASE_STARTED"
                   for e in trail) == 1
    queued_trail = (await client.get(f"/cases/{queued}/events")).json()["events"]
    assert [e["eventType"] for e in queued_trail] == ["CASE_CANCELLED"]
    assert (await client.post(f"/cases/{queued}/cancel")).status_code == 409


async def test_a_deadline_ends_a_running_case(client: httpx.AsyncClient) -> None:
    case_id = await start(client, limits={"deadlineSeconds": 1},
                          model={"provider": "scripted", "name": "slow", "latencyMs": 600})
    case = await ended(client, case_id)
    assert case["status"] == "timed_out"
    trail = (await client.get(f"/cases/{case_id}/events")).json()["events"]
    cycles = [e for e in trail if e["eventType"] == "REACT_CYCLE"]
    assert trail[-1]["eventType"] == "CASE_TIMED_OUT"
    assert trail[-1]["payload"]["cyclesCompleted"] == len(cycles) == 1


async def test_a_provider_without_a_key_fails_the_case_visibly(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    case_id = await start(client, model={"provider": "anthropic", "name": "claude-x"})
    case = await ended(client, case_id)
    assert case["status"] == "failed"
    assert case["outcome"]["reasonCode"] == "model_error"
    assert "no Anthropic API key" in case["outcome"]["message"]


async def test_agents_health_and_openapi(client: httpx.AsyncClient) -> None:
    agents = (await client.get("/agents")).json()["agents"]
    names = {a["name"]: a for a in agents}
    assert set(names) == {"loan-officer", "aml-screening", "throughput-probe"}
    loan = names["loan-officer"]
    assert loan["inputSchema"]["examples"]
    assert {t["source"] for t in loan["tools"]} == {"worker", "local"}
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    ready = await client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["ready"] is True
    spec = (await client.get("/openapi.json")).json()
    assert {"/cases", "/cases/{case_id}", "/cases/{case_id}/events",
            "/cases/{case_id}/cancel", "/agents", "/healthz", "/readyz"} <= set(spec["paths"])


async def test_many_cases_at_once_each_end_once(client: httpx.AsyncClient) -> None:
    ids = await asyncio.gather(*(start(client, app) for app in SAMPLE_APPLICATIONS * 3))
    outcomes = [await ended(client, i, timeout=30) for i in ids]
    assert [o["answer"]["decision"] for o in outcomes] == ["approve", "refer", "decline"] * 3


async def test_one_slot_runs_one_case_at_a_time_and_the_next_waits_in_hand(
    client: httpx.AsyncClient, stack: InProcessStack,
) -> None:
    """The worker holds a start command beyond its slots (the next case is in hand when
    a slot frees), but never works on more cases than it has slots: with one slot, no
    two cases' model turns overlap, though a case may start while the last one's end
    is still being confirmed."""
    paced = {"model": {"provider": "scripted", "name": "paced", "latencyMs": 150}}
    ids = [await start(client, app, **paced) for app in SAMPLE_APPLICATIONS]

    async def one_at_work_one_in_hand() -> bool:
        return stack.worker.slots_busy == 1 and len(stack.worker.live_cases) == 2

    await wait_until(one_at_work_one_in_hand)
    spans = []
    for case_id in ids:  # the refer waits for a person
        assert (await ended(client, case_id, timeout=30))["status"] in ("completed",
                                                                         "awaiting_review")
        trail = (await client.get(f"/cases/{case_id}/events")).json()["events"]
        at_work = [e["occurredAt"] for e in trail if e["eventType"] in
                   ("CASE_STARTED", "REACT_CYCLE")]
        spans.append((min(at_work), max(at_work)))
    spans.sort()
    assert all(earlier[1] < later[0] for earlier, later in itertools.pairwise(spans))
    assert stack.worker.slots_busy == 0
