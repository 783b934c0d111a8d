"""An "overdraft review" agent, declared as its team would in its own package: the
public ``casetrail`` API and nothing under ``service``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from casetrail import (
    FINAL_ANSWER,
    Agent,
    AssistantTurn,
    ChatMessage,
    Check,
    CheckContext,
    Limits,
    LocalTool,
    Sensitive,
    WorkerTool,
    call,
    capability,
    case_input,
    observed,
)


class Camel(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True,
                              alias_generator=lambda name: "".join(
                                  w.capitalize() if i else w
                                  for i, w in enumerate(name.split("_"))))


class OverdraftRequest(Camel):
    account_id: str = Field(pattern=r"^ACC-\d{4}$")
    holder_name: Annotated[str, Sensitive()] = Field(min_length=1, max_length=200)
    requested_limit: int = Field(gt=0, le=10_000)


class HistoryArgs(Camel):
    account_id: str
    holder_name: str


class FeeArgs(Camel):
    requested_limit: int


class OverdraftDecision(Camel):
    decision: Literal["approve", "refer"]
    bounced_payments12m: int = Field(alias="bouncedPayments12m", ge=0)
    monthly_fee: int


def history_consulted(case: CheckContext) -> tuple[bool, str]:
    """No approve without the account's history."""
    if case.answer["decision"] == "approve" and not case.calls_to("overdraft-history"):
        return False, "approve without the overdraft history"
    return True, "the history was consulted" if case.calls_to("overdraft-history") \
        else "refer: a person decides"


def history_of_the_holder(case: CheckContext) -> tuple[bool, str]:
    """The history looked up is the requester's: the check sees the holder's name itself,
    though the signed record holds its placeholder."""
    names = {call["toolArgs"]["holderName"] for call in case.calls_to("overdraft-history")}
    if names - {case.input["holderName"]}:
        return False, f"the history of another holder: {sorted(names)}"
    return True, "the holder's own history" if names else "no history looked up"


@capability("overdraft-history")
async def overdraft_history(args: HistoryArgs) -> dict[str, Any]:
    """The bank's record of the account's past overdrafts (here: from its number)."""
    bounced = int(args.account_id[-1]) % 3
    return {"accountId": args.account_id, "holderOnRecord": args.holder_name,
            "bouncedPayments12m": bounced}


def monthly_fee(args: FeeArgs) -> dict[str, Any]:
    """The monthly fee of an overdraft limit (2% of it, at least 5)."""
    return {"monthlyFee": max(5, round(args.requested_limit * 0.02))}


def review(messages: Sequence[ChatMessage]) -> AssistantTurn:
    """The scripted brain: history and fee first, then the decision."""
    request, seen = case_input(messages), observed(messages)
    if "overdraft-history" not in seen:
        return AssistantTurn(
            text=f"I will look up the overdraft history of {request['holderName']} and the fee.",
            tool_calls=(call("overdraft-history", "call-1", accountId=request["accountId"],
                             holderName=request["holderName"]),
                        call("monthly-fee", "call-2", requestedLimit=request["requestedLimit"])))
    bounced = seen["overdraft-history"]["bouncedPayments12m"]
    decision = "approve" if bounced == 0 else "refer"
    return AssistantTurn(text=f"{bounced} bounced payments: {decision}.", tool_calls=(
        call(FINAL_ANSWER, "final", decision=decision, bouncedPayments12m=bounced,
             monthlyFee=seen["monthly-fee"]["monthlyFee"]),))


OVERDRAFT = Agent(
    name="overdraft-review",
    version="0.3.0",
    description="Decides whether an account may have the overdraft limit it asks for.",
    instructions="You review overdraft requests: check the account's history and the fee, "
                 "then approve or refer.",
    input=OverdraftRequest,
    answer=OverdraftDecision,
    checks=[Check("history-consulted", "1", history_consulted),
            Check("history-of-the-holder", "1", history_of_the_holder)],
    keys=["accountId"],
    tools=[WorkerTool("overdraft-history", args=HistoryArgs,
                      description="Past overdrafts of the account."),
           LocalTool(monthly_fee)],
    limits=Limits(max_cycles=4, deadline_seconds=30),
    script=review,
    capabilities=[overdraft_history],
)
