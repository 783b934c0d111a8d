"""``aml-screening``: screens a customer and their recent transfers for money-laundering
red flags and decides clear, escalate or file-sar.

Tools: ``sanctions-screening`` on a capability worker (WorkerTool) and
``transaction-patterns`` as a local function. Shows the engine is not
specific to lending.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import Field

from casetrail.agents.profile import AgentProfile, CamelModel, case_input, errors_in, observed
from casetrail.contract.events import Limits, ModelRef
from casetrail.engine.answers import FINAL_ANSWER, Check, CheckContext, Review
from casetrail.engine.chat import AssistantTurn, ChatMessage
from casetrail.engine.scripted import call
from casetrail.engine.tools import Capability, LocalTool, WorkerTool
from casetrail.privacy.sensitive import Sensitive

HIGH_RISK_COUNTRIES = frozenset({"IR", "KP", "MM", "SY"})
REPORTING_THRESHOLD = 10_000.0
_WATCHLIST = {"ivan petrov": "OFAC-SDN-48211"}


class Transfer(CamelModel):
    amount: float = Field(gt=0)
    counterparty_country: str = Field(pattern=r"^[A-Z]{2}$")
    date: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}$")


class ScreeningRequest(CamelModel):
    """A customer and their recent transfers."""

    model_config = CamelModel.model_config | {
        "json_schema_extra": {
            "examples": [
                {
                    "customerId": "C-2001",
                    "customerName": "Ana Lopez",
                    "country": "ES",
                    "transfers": [
                        {"amount": 1200, "counterpartyCountry": "FR", "date": "2026-11-02"}
                    ],
                }
            ]
        }
    }

    customer_id: Annotated[str, Sensitive()] = Field(pattern=r"^C-\d{4,10}$")
    customer_name: Annotated[str, Sensitive()] = Field(min_length=1, max_length=200)
    country: str = Field(pattern=r"^[A-Z]{2}$")
    transfers: list[Transfer] = Field(max_length=1000)


class SanctionsArgs(CamelModel):
    name: str = Field(min_length=1)
    country: str = Field(pattern=r"^[A-Z]{2}$")


class PatternArgs(CamelModel):
    transfers: list[Transfer]


async def sanctions_screening(args: SanctionsArgs) -> dict[str, Any]:
    entry = _WATCHLIST.get(args.name.strip().lower())
    return {"match": entry is not None, "listEntry": entry, "listsChecked": ["OFAC", "EU", "UN"]}


def transaction_patterns(args: PatternArgs) -> dict[str, Any]:
    near_threshold = [t for t in args.transfers if 0.9 * REPORTING_THRESHOLD <= t.amount
                      < REPORTING_THRESHOLD]
    high_risk = [t for t in args.transfers if t.counterparty_country in HIGH_RISK_COUNTRIES]
    return {
        "transfers": len(args.transfers),
        "total": round(sum(t.amount for t in args.transfers), 2),
        "structuringSuspected": len(near_threshold) >= 3,
        "nearThresholdCount": len(near_threshold),
        "highRiskCountryCount": len(high_risk),
    }


def think(messages: Sequence[ChatMessage]) -> AssistantTurn:
    """The AML analyst's scripted reasoning."""
    request = case_input(messages)
    seen = observed(messages)
    if not seen:
        return AssistantTurn(
            text=(
                f"Screening customer {request['customerId']} ({request['customerName']}, "
                f"{request['country']}) with {len(request['transfers'])} recent transfers. "
                "I will check the sanctions lists and analyse the transfer pattern at once."
            ),
            tool_calls=(
                call("sanctions-screening", "call-1", name=request["customerName"],
                     country=request["country"]),
                call("transaction-patterns", "call-2", transfers=request["transfers"]),
            ),
        )
    failures = errors_in(seen)
    if failures:
        decision, why = "escalate", "screening incomplete: " + "; ".join(failures)
    else:
        sanctions, pattern = seen["sanctions-screening"], seen["transaction-patterns"]
        if sanctions["match"]:
            decision, why = "file-sar", f"sanctions list match {sanctions['listEntry']}"
        elif pattern["structuringSuspected"] or pattern["highRiskCountryCount"]:
            decision, why = "escalate", (
                f"{pattern['nearThresholdCount']} transfers just under the reporting threshold, "
                f"{pattern['highRiskCountryCount']} to high-risk countries"
            )
        else:
            decision, why = "clear", (
                f"no sanctions match; {pattern['transfers']} transfers totalling "
                f"{pattern['total']} show no red flags"
            )
    return AssistantTurn(text=f"Decision: {decision}, because {why}.", tool_calls=(
        call(FINAL_ANSWER, "final", decision=decision, customerId=request["customerId"],
             rationale=why),))


class ScreeningDecision(CamelModel):
    """The AML analyst's answer."""

    decision: Literal["clear", "escalate", "file-sar"]
    customer_id: str = Field(description="The customer screened (the case's own).")
    rationale: str = Field(min_length=1, max_length=4000)


def _screened(case: CheckContext) -> tuple[bool, str]:
    """A customer is cleared only after the sanctions lists were checked for their name."""
    screened = [c for c in case.calls_to("sanctions-screening") if c.get("error") is None
                and c["toolArgs"].get("name") == case.input["customerName"]]
    if screened:
        return True, f"screened against {', '.join(screened[-1]['toolResult']['listsChecked'])}"
    if case.answer["decision"] == "clear":
        return False, "cleared without a sanctions screening of the customer's own name"
    return True, f"{case.answer['decision']}: a person looks at it"


def _the_customer(case: CheckContext) -> tuple[bool, str]:
    if case.answer["customerId"] != case.input["customerId"]:
        return False, "the answer names another customer than the case's"
    return True, "the answer names the case's customer"


CHECKS = (
    Check("sanctions-screened", "1", _screened),
    Check("names-the-customer", "1", _the_customer),
)


CAPABILITIES: tuple[Capability[Any], ...] = (
    Capability("sanctions-screening", SanctionsArgs, sanctions_screening),
)

AML_SCREENING = AgentProfile(
    name="aml-screening",
    description=(
        "Screens a customer against sanctions lists and their recent transfers for "
        "structuring and high-risk corridors; decides clear, escalate or file-sar."
    ),
    system_prompt=(
        "You are an AML analyst. Screen the customer against sanctions lists and analyse "
        "their transfers. Give your decision by calling final_answer: decision (clear, escalate "
        "or file-sar), customerId, rationale."
    ),
    tools=(
        WorkerTool("sanctions-screening", "Screens a name against OFAC, EU and UN lists.",
                   "sanctions-screening", SanctionsArgs),
        LocalTool("transaction-patterns", "Flags structuring and high-risk corridors.",
                  PatternArgs, transaction_patterns),
    ),
    input_model=ScreeningRequest,
    default_model=ModelRef(provider="scripted", name="aml-screening-scripted"),
    default_limits=Limits(max_cycles=6, deadline_seconds=60),
    script=think,
    capabilities=CAPABILITIES,
    version="1.2.0",
    answer_model=ScreeningDecision,
    checks=CHECKS,
    keys=("customerId",),
    review=Review(decisions=frozenset({"escalate", "file-sar"})),
)
