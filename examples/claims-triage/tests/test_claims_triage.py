"""The agent tested as its team would: in process, with casetrail's ``run_case``,
against the real policy server over stdio — with the scripted model, and with a model
of our own behind a local OpenAI-compatible server (tests/local_model.py)."""

from __future__ import annotations

import sys

import pytest
from claims_triage.agent import CLAIMS_TRIAGE
from local_model import local_model

from casetrail import ModelRef
from casetrail.testing import run_case

POLICIES = [{"name": "policies", "transport": "stdio",
             "command": [sys.executable, "-m", "claims_triage.policy_server"],
             "env": {"PYTHONPATH": "PYTHONPATH"}}]
CLAIM = {"claimId": "CLM-00042", "policyNumber": "POL-100001", "claimantName": "Ada Lovelace",
         "amount": 3_000, "cause": "fire"}


@pytest.mark.asyncio
async def test_a_covered_claim_is_paid_less_the_deductible() -> None:
    run = await run_case(CLAIMS_TRIAGE, CLAIM, mcp_servers=POLICIES)
    assert run.status == "completed"
    assert run.answer == {"decision": "pay", "payout": 2_500,
                          "reason": "covered, deductible applied"}
    coverage = run.cycles[0]["toolCalls"][0]
    assert coverage["toolName"] == "policies_coverage"
    assert coverage["mcp"]["server"] == "policies" and coverage["mcp"]["tool"] == "coverage"
    assert coverage["toolResult"]["deductible"] == 500


@pytest.mark.asyncio
async def test_a_claimant_who_does_not_hold_the_policy_is_investigated() -> None:
    run = await run_case(CLAIMS_TRIAGE, {**CLAIM, "claimantName": "Charles Babbage"},
                         mcp_servers=POLICIES)
    assert run.answer is not None and run.answer["decision"] == "investigate"


@pytest.mark.asyncio
async def test_an_excluded_cause_is_denied() -> None:
    run = await run_case(CLAIMS_TRIAGE, {**CLAIM, "cause": "flood"}, mcp_servers=POLICIES)
    assert run.answer is not None and run.answer["decision"] == "deny"


@pytest.mark.asyncio
async def test_a_third_claim_waits_for_a_person() -> None:
    run = await run_case(CLAIMS_TRIAGE, {**CLAIM, "policyNumber": "POL-100002"},
                         mcp_servers=POLICIES)
    assert run.status == "awaiting_review"
    assert run.answer is not None and run.answer["decision"] == "investigate"


@pytest.mark.asyncio
async def test_a_real_model_behind_a_local_endpoint_decides_the_claim() -> None:
    """``run_case`` with a ``ModelRef`` speaks to a configured endpoint with casetrail's
    own OpenAI client, over HTTP, as a worker would."""
    async with local_model() as (base_url, requests):
        run = await run_case(
            CLAIMS_TRIAGE, CLAIM, mcp_servers=POLICIES,
            model=ModelRef(provider="openai", name="local-llama", endpoint="local"),
            endpoints=[{"name": "local", "provider": "openai", "baseUrl": base_url}])
    assert run.status == "completed", run.terminal
    assert run.answer == {"decision": "pay", "payout": 2_500,
                          "reason": "covered, deductible applied"}
    assert run.events[0].payload.model.endpoint == "local"  # on the record
    assert [r["model"] for r in requests] == ["local-llama", "local-llama"]
    offered = {t["function"]["name"] for t in requests[0]["tools"]}
    assert {"policies_coverage", "claims-history", "payout-estimate"} <= offered
