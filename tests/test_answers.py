"""Decisions that hold: the answer given through the final-answer tool and validated
against the agent's schema, refused answers sent back with their errors (each on the
record), and the agent's checks run before the outcome, carried by the signed terminal
event. The whole-stack cases use a local server speaking OpenAI's wire format."""

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
from casetrail.agents.loan_officer import SAMPLE_APPLICATIONS, think
from casetrail.audit.resume import RecordedEvent, resumption
from casetrail.config import ModelEndpoint, Settings
from casetrail.contract.integrity import public_key_text
from casetrail.engine.answers import FINAL_ANSWER, feedback
from casetrail.engine.chat import AssistantTurn, ToolResultMessage, UserMessage
from casetrail.engine.loop import ReactEngine
from casetrail.engine.scripted import ScriptedModel, call
from casetrail.trail.keyfile import worker_signer
from tests.fake_llm import FakeLLM, fake_llm, openai_turn
from tests.helpers import ListSink, ended, spec_for, toolbox
from tests.stack import in_process_stack
from tests.test_integrity import STANDALONE_VERIFIER

APPLICATION = SAMPLE_APPLICATIONS[0]  # A-1001, approved by the lending policy
VALID = {"decision": "refer", "applicantId": "A-1001", "rationale": "an underwriter decides"}


async def run(turns: list[AssistantTurn], **spec: Any) -> ListSink:
    """The loan officer's answers and checks, without review unless asked (these tests
    are about answers; tests/test_review.py about people deciding)."""
    sink = ListSink()
    await ReactEngine(sink).run(spec_for(APPLICATION, **{"review": False, **spec}),
                                ScriptedModel(turns), toolbox())
    return sink


def events_of(sink: ListSink) -> list[Any]:
    """The events, their payloads read as the test knows them to be."""
    return list(sink.events)


def final(answer: dict[str, Any], text: str = "Decided.") -> AssistantTurn:
    return AssistantTurn(text, (call(FINAL_ANSWER, "f", **answer),))


async def test_a_prose_answer_is_sent_back_and_the_typed_one_stands() -> None:
    sink = await run([AssistantTurn('Sure! I think this loan is fine, go ahead.'), final(VALID)])
    assert sink.types == ["CASE_STARTED", "REACT_CYCLE", "REACT_CYCLE", "CASE_COMPLETED"]
    refused = events_of(sink)[1].payload.answer_rejected
    assert refused.answer == "Sure! I think this loan is fine, go ahead."
    assert refused.tool_call_id is None and "final_answer" in refused.errors[0]
    assert events_of(sink)[1].payload.tool_calls == ()
    accepted = events_of(sink)[2].payload
    assert accepted.answer == {**VALID, "reasonCodes": [], "figures": None}
    assert accepted.tool_calls == ()  # the answer is never a tool call
    terminal = events_of(sink)[-1].payload
    assert terminal.answer["decision"] == "refer"
    assert [(c.name, c.passed) for c in terminal.checks] == [
        ("lending-policy-consulted", True), ("names-the-applicant", True),
        ("decline-has-reason-code", True)]
    started = events_of(sink)[0].payload
    assert started.answer_schema_digest is not None


async def test_invalid_answers_beyond_the_limit_fail_the_case_invalid_answer() -> None:
    wrong = {"decision": "maybe", "applicantId": "A-1001", "rationale": "?"}
    sink = await run([final(wrong)] * 3)
    assert sink.types == ["CASE_STARTED", *["REACT_CYCLE"] * 3, "CASE_FAILED"]
    for cycle in events_of(sink)[1:4]:
        rejected = cycle.payload.answer_rejected
        assert rejected.answer == wrong and rejected.tool_call_id == "f"
        assert "decision" in rejected.errors[0]
    failed = events_of(sink)[-1].payload
    assert failed.reason_code == "invalid_answer"
    assert "3 answers refused (at most 2 may be)" in failed.message
    one = await run([final(wrong)] * 2 + [final(VALID)], max_cycles=8)
    assert one.types[-1] == "CASE_COMPLETED"  # two refusals are within the limit


async def test_a_final_answer_beside_other_calls_is_refused_and_the_calls_run() -> None:
    both = AssistantTurn("Both at once.", (call("credit-score", "c1", applicantId="A-1001"),
                                           call(FINAL_ANSWER, "f", **VALID)))
    sink = await run([both, final(VALID)])
    cycle = events_of(sink)[1].payload
    assert [c.tool_name for c in cycle.tool_calls] == ["credit-score"]
    assert "only call of its turn" in cycle.answer_rejected.errors[0]
    assert sink.types[-1] == "CASE_COMPLETED"


async def test_a_blocking_check_refuses_an_approve_for_another_applicant() -> None:
    """The model scores applicant A-3001 on case A-1001 and approves without the policy:
    no approve is recorded; the case fails with each check's verdict on the record."""
    sink = await run([
        AssistantTurn("Scoring.", (call("credit-score", "c1", applicantId="A-3001"),)),
        final({"decision": "approve", "applicantId": "A-1001", "rationale": "score ok"})])
    failed = events_of(sink)[-1]
    assert failed.event_type == "CASE_FAILED"
    assert failed.payload.reason_code == "policy_check_failed"
    verdicts = {c.name: c for c in failed.payload.checks}
    assert not verdicts["names-the-applicant"].passed
    assert "A-3001" in verdicts["names-the-applicant"].detail
    assert not verdicts["lending-policy-consulted"].passed
    assert "approve without consulting lending-policy" in failed.payload.message
    assert all(c.blocking for c in verdicts.values())


@pytest.mark.parametrize("application", SAMPLE_APPLICATIONS)
async def test_the_scripted_agents_pass_every_check(application: dict[str, Any]) -> None:
    sink = ListSink()
    await ReactEngine(sink).run(spec_for(application), ScriptedModel(think), toolbox())
    terminal = events_of(sink)[-1].payload
    # A refer waits for a person; every other decision stands as the agent's.
    assert events_of(sink)[-1].event_type == (
        "CASE_AWAITING_REVIEW" if terminal.answer["decision"] == "refer" else "CASE_COMPLETED")
    assert len(terminal.checks) == 3 and all(c.passed for c in terminal.checks)
    if terminal.answer["decision"] == "decline":
        assert terminal.answer["reasonCodes"]


def test_a_refused_answer_is_rebuilt_exactly_when_a_case_resumes() -> None:
    """The next attempt sends the model what the first one did: the refused call and
    its error, or the message after a prose answer."""
    when: Any = None  # (when they happened does not matter here)
    started = RecordedEvent(1, 0, "CASE_STARTED", {}, when)
    usage = {"inputTokens": 1, "outputTokens": 1}
    cycles = [
        {"cycleIndex": 0, "reasoningText": "in prose", "toolCalls": [], "tokenUsage": usage,
         "answerRejected": {"answer": "in prose", "errors": ["give it by calling final_answer"]}},
        {"cycleIndex": 1, "reasoningText": "typed", "toolCalls": [], "tokenUsage": usage,
         "answerRejected": {"answer": {"decision": "maybe"}, "errors": ["decision: bad"],
                            "toolCallId": "f1"}},
    ]
    found = resumption([started, *(RecordedEvent(1, i + 1, "REACT_CYCLE", c, when)
                                   for i, c in enumerate(cycles))], {})
    assert found is not None and found.rejections == 2 and found.answer is None
    messages: list[Any] = list(found.messages)
    assert messages[1] == UserMessage(feedback(["give it by calling final_answer"]))
    assert messages[2].tool_calls[0].name == FINAL_ANSWER
    assert messages[3] == ToolResultMessage("f1", FINAL_ANSWER,
                                            f"ERROR: {feedback(['decision: bad'])}",
                                            is_error=True)


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
