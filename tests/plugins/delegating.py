"""An "onboarding" agent that asks a remote A2A agent (tests/plugins/a2a_remote.py,
configured as ``kyc``) for a sanctions check and answers with what it said: the tests
of remote A2A agents as tools (tests/integration/test_a2a_tools.py). Declared through
the public ``casetrail`` API only."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from casetrail import (
    FINAL_ANSWER,
    A2aTool,
    Agent,
    AssistantTurn,
    ChatMessage,
    Limits,
    Sensitive,
    call,
    case_input,
    observed,
)

TOOL = "kyc_sanctions"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Customer(Strict):
    customerId: str = Field(min_length=1)
    passport: Annotated[str, Sensitive()] | None = None


class KycQuery(Strict):
    customerId: str
    passport: str | None = None


class Onboarding(Strict):
    customerId: str
    sanctionsHit: bool | None
    checkedBy: str | None
    problem: str | None
    """Why the remote agent gave no answer (its tool error), if it did not."""


def onboard(messages: Sequence[ChatMessage]) -> AssistantTurn:
    given = case_input(messages)
    seen = observed(messages)
    if TOOL not in seen:
        query = {"customerId": given["customerId"]}
        if given.get("passport"):
            query["passport"] = given["passport"]
        return AssistantTurn(text="I will ask the KYC agent.", tool_calls=(
            call(TOOL, "kyc-1", **query),))
    got = seen[TOOL]
    if isinstance(got, Exception):
        return AssistantTurn(text="The KYC agent gave no answer.", tool_calls=(
            call(FINAL_ANSWER, "final", customerId=given["customerId"], sanctionsHit=None,
                 checkedBy=None, problem=str(got)),))
    data = got[0]["parts"][0]["data"]
    return AssistantTurn(text="The KYC agent answered.", tool_calls=(
        call(FINAL_ANSWER, "final", customerId=data["customerId"],
             sanctionsHit=data["sanctionsHit"], checkedBy=data["checkedBy"], problem=None),))


ONBOARDING = Agent(
    name="onboarding", version="1.0.0", description="Onboards a customer after a KYC check.",
    instructions="Ask the KYC agent about the customer, then answer with what it said.",
    input=Customer, answer=Onboarding,
    tools=[A2aTool("kyc", "sanctions", input=KycQuery, name=TOOL)],
    limits=Limits(max_cycles=3, deadline_seconds=60), script=onboard,
)
