"""Typed answers through the whole stack: a real provider's wire format (a local server
speaking it), the bus, the log, and the offline verifier."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import aio_pika
import asyncpg
import httpx
import orjson
import pytest

from casetrail.agents import AGENTS
from casetrail.agents.loan_officer import SAMPLE_APPLICATIONS
from casetrail.config import ModelEndpoint, Settings
from casetrail.contract.integrity import public_key_text
from casetrail.engine.answers import FINAL_ANSWER
from casetrail.trail.keyfile import worker_signer
from tests.support.cli import STANDALONE_VERIFIER
from tests.support.fake_llm import FakeLLM, fake_llm, openai_turn
from tests.support.helpers import ended
from tests.support.stack import in_process_stack

APPLICATION = SAMPLE_APPLICATIONS[0]  # A-1001, approved by the lending policy

VALID = {"decision": "refer", "applicantId": "A-1001", "rationale": "an underwriter decides"}


@pytest.fixture(scope="module")
async def provider(settings: Settings, amqp: aio_pika.abc.AbstractRobustConnection,
                   pool: asyncpg.Pool, auth_headers: dict[str, str],
                   ) -> AsyncIterator[tuple[httpx.AsyncClient, FakeLLM]]:
    """A stack whose loan officer cases run on a local server speaking OpenAI's wire
    format (each test gives it the turns its case gets)."""
    async with fake_llm() as server:
        allowed = settings.model_copy(update={"model_endpoints": [ModelEndpoint(
            name="fake", provider="openai", base_url=f"{server.base_url}/v1")]})
        async with in_process_stack(allowed, amqp, pool) as stack, \
                httpx.AsyncClient(base_url=stack.base_url, headers=auth_headers) as client:
            yield client, server


async def on_the_provider(provider: tuple[httpx.AsyncClient, FakeLLM], turns: list[Any]
                          ) -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
    """A loan case answered by ``turns``: its id, its view and its trail."""
    client, server = provider
    server.script, server.repeat_last = list(turns), False
    server.requests.clear()
    reply = await client.post("/cases", json={
        "agent": "loan-officer", "input": APPLICATION,
        "model": {"provider": "openai", "name": "gpt-test", "endpoint": "fake"}})
    case_id = reply.json()["caseId"]
    case = await ended(client, case_id, timeout=30)
    trail = (await client.get(f"/cases/{case_id}/events")).json()["events"]
    return case_id, case, trail


def answering(answer: dict[str, Any], call_id: str = "f1") -> Any:
    return openai_turn("My answer.", [(call_id, FINAL_ANSWER, orjson.dumps(answer).decode())])


async def test_a_prose_answer_over_the_wire_is_sent_back_then_the_typed_one_verifies_offline(
    provider: tuple[httpx.AsyncClient, FakeLLM], settings: Settings, tmp_path: Any,
) -> None:
    """"Sure! ... go ahead." is refused with the reason the model is sent; the typed
    answer that follows (a refer) waits for a person, with its checks in the signed
    CASE_AWAITING_REVIEW; the case's bundle carries them and verifies offline with the
    standalone verifier."""
    case_id, case, trail = await on_the_provider(provider, [
        openai_turn("Sure! I think this loan is fine, go ahead."), answering(VALID)])
    client, server = provider
    assert case["status"] == "awaiting_review" and case["answer"]["decision"] == "refer"
    assert trail[-1]["eventType"] == "CASE_AWAITING_REVIEW"
    assert trail[-1]["payload"]["reviewReasons"] == ["decision"]
    told = server.requests[1]["messages"][-1]
    assert told["role"] == "user" and "not accepted" in told["content"]
    assert FINAL_ANSWER in {t["function"]["name"] for t in server.requests[0]["tools"]}
    cycles = [e["payload"] for e in trail if e["eventType"] == "REACT_CYCLE"]
    assert cycles[0]["answerRejected"]["answer"] == "Sure! I think this loan is fine, go ahead."
    assert cycles[1]["answer"]["decision"] == "refer" and cycles[1]["toolCalls"] == []
    assert all(c["passed"] for c in trail[-1]["payload"]["checks"])
    officer = AGENTS["loan-officer"]
    assert trail[0]["payload"]["agentDigest"] == officer.digest  # what ran, hashed
    assert replace(officer, checks=officer.checks[:2]).digest != officer.digest
    bundle = (await client.get(f"/cases/{case_id}/bundle")).json()
    signed = orjson.loads(bundle["events"][-1]["body"])  # the wait for review, as signed
    assert signed["payload"]["checks"] == trail[-1]["payload"]["checks"]
    path = tmp_path / "bundle.json"
    path.write_bytes(orjson.dumps(bundle))
    trusted = public_key_text(worker_signer(settings).public_key)
    alone = await asyncio.to_thread(
        subprocess.run, [sys.executable, str(STANDALONE_VERIFIER), str(path), "--trust",
                         trusted], capture_output=True, text=True, check=False)
    assert alone.returncode == 0 and "verified" in alone.stdout, alone.stderr


async def test_three_invalid_answers_over_the_wire_end_the_case_invalid_answer(
    provider: tuple[httpx.AsyncClient, FakeLLM],
) -> None:
    wrong = {"decision": "yes please", "applicantId": "A-1001", "rationale": "fine"}
    _, case, trail = await on_the_provider(provider, [answering(wrong, f"f{i}")
                                                      for i in range(3)])
    assert case["status"] == "failed" and case["answer"] is None
    assert [e["eventType"] for e in trail] == ["CASE_STARTED", *["REACT_CYCLE"] * 3,
                                               "CASE_FAILED"]
    assert trail[-1]["payload"]["reasonCode"] == "invalid_answer"
    assert [e["payload"]["answerRejected"]["toolCallId"] for e in trail[1:4]] == \
        ["f0", "f1", "f2"]


async def test_a_wrong_applicant_over_the_wire_fails_its_checks_and_no_approve_stands(
    provider: tuple[httpx.AsyncClient, FakeLLM], pool: asyncpg.Pool,
) -> None:
    """The model scores another applicant (A-3002) and approves without the policy: no
    approve stands; a blocking check failed, so a person decides (the loan officer has
    people decide those): each verdict in the signed CASE_AWAITING_REVIEW, no decision
    on record, the trail verified."""
    approve = {"decision": "approve", "applicantId": "A-1001", "rationale": "fine",
               "reasonCodes": []}
    case_id, case, trail = await on_the_provider(provider, [
        openai_turn("Scoring.", [("c1", "credit-score", '{"applicantId": "A-3002"}')]),
        answering(approve)])
    client, _ = provider
    assert case["status"] == "awaiting_review"
    cycles = [e["payload"] for e in trail if e["eventType"] == "REACT_CYCLE"]
    assert cycles[1]["answer"]["decision"] == "approve"  # what the model said, on record
    terminal = trail[-1]
    assert terminal["eventType"] == "CASE_AWAITING_REVIEW"
    assert terminal["payload"]["reviewReasons"] == ["failed_check"]
    failed = {c["name"] for c in terminal["payload"]["checks"] if not c["passed"]}
    assert failed == {"names-the-applicant", "lending-policy-consulted"}
    assert (await client.get(f"/cases/{case_id}/verify")).json()["verified"] is True
    approved = (await client.get("/cases", params={"status": "completed", "decision": "approve",
                                                    "limit": 200})).json()["items"]
    assert case_id not in {item["caseId"] for item in approved}
    refused = (await client.get("/cases", params={"checks": "failed",
                                                   "limit": 200})).json()["items"]
    assert case_id in {item["caseId"] for item in refused}
    # No decision stands: case_decisions holds ended cases only.
    assert await pool.fetchval("SELECT count(*) FROM case_decisions WHERE case_id = $1::uuid",
                               case_id) == 0
    assert AGENTS["loan-officer"].describe()["answerSchema"]["properties"]["decision"][
        "enum"] == ["approve", "refer", "decline"]
