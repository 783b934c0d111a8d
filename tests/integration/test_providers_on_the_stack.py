"""A case on the OpenAI-compatible provider (a local server speaking its wire format)
through the whole stack."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import aio_pika
import asyncpg
import httpx
import orjson
import pytest
from pydantic import SecretStr

from casetrail.agents import AGENTS
from casetrail.agents.loan_officer import SAMPLE_APPLICATIONS
from casetrail.config import ModelEndpoint, Settings
from tests.support.fake_llm import FakeLLM, fake_llm, openai_turn
from tests.support.helpers import ended
from tests.support.stack import in_process_stack

ENDPOINT_SECRET = "sk-endpoint-only-3f9a1c"

SECRET = "sk-test-secret-0000"


@pytest.fixture(scope="module")
async def openai_server() -> AsyncIterator[FakeLLM]:
    async with fake_llm() as server:
        yield server


ANSWER = {"decision": "refer", "applicantId": "A-1001",
          "rationale": "Credit score 742; referred for the policy check."}


async def test_a_case_on_the_openai_provider_runs_through_the_whole_stack(
    settings: Settings, amqp: aio_pika.abc.AbstractRobustConnection, pool: asyncpg.Pool,
    openai_server: FakeLLM, auth_headers: dict[str, str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    base_url = f"{openai_server.base_url}/v1"
    # The endpoint's own key; the provider key must never reach it.
    monkeypatch.setenv("CASETRAIL_TEST_LOCAL_LLM_KEY", ENDPOINT_SECRET)
    allowed = settings.model_copy(update={
        "model_endpoints": [ModelEndpoint(name="local", provider="openai", base_url=base_url,
                                          api_key_env="CASETRAIL_TEST_LOCAL_LLM_KEY")],
        "openai_api_key": SecretStr(SECRET)})
    openai_server.script = [
        openai_turn("I need the credit score.",
                    calls=[("call_1", "credit-score", '{"applicantId": "A-1001"}')],
                    prompt=500, completion=20),
        openai_turn("The score is 742; without the policy an underwriter decides.",
                    calls=[("call_2", "final_answer", orjson.dumps(ANSWER).decode())],
                    prompt=600, completion=25),
    ]
    model = {"provider": "openai", "name": "gpt-test", "baseUrl": base_url}
    async with in_process_stack(allowed, amqp, pool) as stack, \
            httpx.AsyncClient(base_url=stack.base_url, headers=auth_headers) as client:
        for wrong, field in ((
                {**model, "baseUrl": "http://198.51.100.7/v1"}, "baseUrl"),
                ({"provider": "openai", "name": "gpt-test", "endpoint": "elsewhere"},
                 "endpoint"),
                ({"provider": "anthropic", "name": "claude", "endpoint": "local"}, "endpoint")):
            refused = await client.post("/cases", json={
                "agent": "loan-officer", "input": SAMPLE_APPLICATIONS[0], "model": wrong})
            assert refused.status_code == 422 and field in refused.text, refused.text
        # By name, as a case should; the exact baseUrl is accepted too.
        model = {"provider": "openai", "name": "gpt-test", "endpoint": "local"}
        reply = await client.post("/cases", json={"agent": "loan-officer",
                                                  "input": SAMPLE_APPLICATIONS[0],
                                                  "model": model})
        case_id = reply.json()["caseId"]

        case = await ended(client, case_id, timeout=30)
        trail = (await client.get(f"/cases/{case_id}/events")).json()["events"]
    assert case["status"] == "awaiting_review"  # a refer: a person decides
    assert case["answer"] == {**ANSWER, "reasonCodes": [], "figures": None}  # as validated
    assert case["tokenUsage"] == {"inputTokens": 1100, "outputTokens": 45}
    cycles = [e["payload"] for e in trail if e["eventType"] == "REACT_CYCLE"]
    assert [c["model"] for c in cycles] == ["gpt-test", "gpt-test"]
    assert cycles[0]["toolCalls"][0]["toolSource"] == "worker"
    assert cycles[0]["toolCalls"][0]["toolResult"]["score"] == 742
    stored = await pool.fetchval("SELECT string_agg(payload::text, '') FROM event_log "
                                 "WHERE case_id = $1", uuid.UUID(case_id))
    assert SECRET not in stored and SECRET not in orjson.dumps(case).decode()
    sent = {h.get("authorization") for h in openai_server.headers}
    assert sent == {f"Bearer {ENDPOINT_SECRET}"}  # its own key, never the provider's
    assert AGENTS["loan-officer"].system_prompt in openai_server.requests[0]["messages"][0][
        "content"]
