"""The claims-triage agent: reads the policy's coverage from the insurer's MCP server,
the claim history from a capability of its own, works out the payout in process, and
pays, denies, or sends the claim to a person for investigation.

Written with casetrail's public API (``casetrail``) alone."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from casetrail import (
    FINAL_ANSWER,
    Agent,
    AssistantTurn,
    ChatMessage,
    Check,
    CheckContext,
    Limits,
    LocalTool,
    McpTool,
    Review,
    Sensitive,
    WorkerTool,
    call,
    capability,
    case_input,
    observed,
)


class Camel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True,
                              extra="forbid")


class Claim(Camel):
    claim_id: str = Field(pattern=r"^CLM-\d{5}$")
    policy_number: str = Field(pattern=r"^POL-\d{6}$")
    claimant_name: Annotated[str, Sensitive()] = Field(min_length=1, max_length=200)
    amount: int = Field(gt=0, le=1_000_000, description="Claimed amount, whole currency units.")
    cause: str = Field(min_length=1, max_length=100, description="e.g. fire, theft, flood.")


class HistoryArgs(Camel):
    policy_number: str


class PayoutArgs(Camel):
    amount: int
    deductible: int
    coverage_limit: int


class TriageDecision(Camel):
    decision: Literal["pay", "deny", "investigate"]
    payout: int = Field(ge=0)
    reason: str = Field(min_length=1)


@capability("claims-history")
async def claims_history(args: HistoryArgs) -> dict[str, Any]:
    """The claims already made on a policy in the last three years (here: from its
    number)."""
    earlier = int(args.policy_number[-1]) % 4
    return {"policyNumber": args.policy_number, "claims3y": earlier}


def payout_estimate(args: PayoutArgs) -> dict[str, Any]:
    """What the policy pays for a claim: the amount less the deductible, at most the
    coverage limit."""
    return {"payout": max(0, min(args.amount - args.deductible, args.coverage_limit))}


def coverage_consulted(case: CheckContext) -> tuple[bool, str]:
    """Nothing is paid without the policy's coverage having been read."""
    read = case.calls_to("policies_coverage")
    if case.answer["decision"] == "pay" and not read:
        return False, "pay without reading the policy's coverage"
    return True, "coverage read" if read else "nothing paid"


def triage(messages: Sequence[ChatMessage]) -> AssistantTurn:
    """The scripted brain: coverage (the claimant's name goes to the insurer's server,
    sealed: the trail holds its placeholder) and history first, then the payout, then
    the decision."""
    claim, seen = case_input(messages), observed(messages)
    if "policies_coverage" not in seen:
        return AssistantTurn(
            text=f"I read policy {claim['policyNumber']}'s coverage and its claim history.",
            tool_calls=(call("policies_coverage", "c1", policy_number=claim["policyNumber"],
                             claimant_name=claim["claimantName"]),
                        call("claims-history", "c2", policyNumber=claim["policyNumber"])))
    coverage = seen["policies_coverage"]
    if isinstance(coverage, Exception):
        return AssistantTurn(text=f"The coverage could not be read ({coverage}).",
                             tool_calls=(call(FINAL_ANSWER, "final", decision="investigate",
                                              payout=0, reason=str(coverage)),))
    if not coverage["holderMatches"]:
        return AssistantTurn(text="The claimant does not hold this policy.", tool_calls=(
            call(FINAL_ANSWER, "final", decision="investigate", payout=0,
                 reason="the claimant is not the policy holder"),))
    if not coverage["active"] or claim["cause"] in coverage["excluded"]:
        why = "the policy is not active" if not coverage["active"] \
            else f"{claim['cause']} is excluded"
        return AssistantTurn(text=f"Denied: {why}.", tool_calls=(
            call(FINAL_ANSWER, "final", decision="deny", payout=0, reason=why),))
    if "payout-estimate" not in seen:
        return AssistantTurn(text="Covered: I work out the payout.", tool_calls=(
            call("payout-estimate", "c3", amount=claim["amount"],
                 deductible=coverage["deductible"], coverageLimit=coverage["coverageLimit"]),))
    payout = seen["payout-estimate"]["payout"]
    earlier = seen["claims-history"]["claims3y"]
    if earlier >= 2:
        return AssistantTurn(text=f"{earlier} earlier claims: a person investigates.",
                             tool_calls=(call(FINAL_ANSWER, "final", decision="investigate",
                                              payout=payout,
                                              reason=f"{earlier} claims in three years"),))
    return AssistantTurn(text=f"Pay {payout}.", tool_calls=(
        call(FINAL_ANSWER, "final", decision="pay", payout=payout,
             reason="covered, deductible applied"),))


CLAIMS_TRIAGE = Agent(
    name="claims-triage",
    version="0.2.0",
    description="Triages an insurance claim: pay, deny, or investigate.",
    instructions="You triage insurance claims. Read the policy's coverage and the claim "
                 "history, work out the payout, then decide: pay, deny (not covered) or "
                 "investigate (a person looks at it).",
    input=Claim,
    answer=TriageDecision,
    checks=[Check("coverage-consulted", "1", coverage_consulted)],
    review=Review(decisions={"investigate"}),
    keys=["claimId"],
    tools=[McpTool("policies", "coverage"),
           WorkerTool("claims-history", args=HistoryArgs,
                      description="Claims made on the policy in the last three years."),
           LocalTool(payout_estimate)],
    limits=Limits(max_cycles=5, deadline_seconds=60),
    script=triage,
    capabilities=[claims_history],
)
