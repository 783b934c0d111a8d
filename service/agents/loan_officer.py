"""``loan-officer``: evaluates a consumer loan application and decides approve, refer
or decline, citing the figures it relied on.

Tools: ``credit-score`` and ``risk-model-retrieval`` run on capability workers
(WorkerTools); ``debt-to-income`` and ``lending-policy`` are local functions.
The scripted brain reasons deterministically from the application, so every
sample applicant has a known outcome.
"""

from __future__ import annotations

import hashlib
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

POLICY_VERSION = "LP-2026.3"


class LoanApplication(CamelModel):
    """A consumer loan application."""

    model_config = CamelModel.model_config | {
        "json_schema_extra": {
            "examples": [
                {
                    "applicantId": "A-1001",
                    "applicantName": "Maria Okafor",
                    "loanAmount": 25000,
                    "termMonths": 60,
                    "monthlyIncome": 9000,
                    "monthlyDebt": 2100,
                    "purpose": "home improvement",
                }
            ]
        }
    }

    applicant_id: str = Field(pattern=r"^[A-Z]-\d{4,10}$", description="e.g. A-1001")
    applicant_name: Annotated[str, Sensitive()] = Field(min_length=1, max_length=200)
    loan_amount: float = Field(gt=0, le=5_000_000, description="Requested principal.")
    term_months: int = Field(ge=6, le=480)
    monthly_income: float = Field(gt=0, description="Gross monthly income.")
    monthly_debt: float = Field(ge=0, description="Existing monthly debt payments.")
    purpose: str = Field(min_length=1, max_length=200)


SAMPLE_APPLICATIONS: tuple[dict[str, Any], ...] = (
    {
        "applicantId": "A-1001", "applicantName": "Maria Okafor", "loanAmount": 25000,
        "termMonths": 60, "monthlyIncome": 9000, "monthlyDebt": 2100,
        "purpose": "home improvement",
    },
    {
        "applicantId": "A-1002", "applicantName": "Daniel Reyes", "loanAmount": 18000,
        "termMonths": 48, "monthlyIncome": 5200, "monthlyDebt": 2000, "purpose": "used car",
    },
    {
        "applicantId": "A-1003", "applicantName": "Priya Nair", "loanAmount": 30000,
        "termMonths": 72, "monthlyIncome": 3800, "monthlyDebt": 2300,
        "purpose": "debt consolidation",
    },
)
"""One approve, one refer, one decline."""

_BUREAU = {"A-1001": 742, "A-1002": 668, "A-1003": 561}


class CreditScoreArgs(CamelModel):
    applicant_id: str = Field(pattern=r"^[A-Z]-\d{4,10}$")


class RiskModelArgs(CamelModel):
    model_id: Literal["standard-v2", "subprime-v1"]
    credit_score: int = Field(ge=300, le=850)
    loan_amount: float = Field(gt=0)


class DebtToIncomeArgs(CamelModel):
    monthly_debt: float = Field(ge=0)
    monthly_income: float = Field(gt=0)


class LendingPolicyArgs(CamelModel):
    credit_score: int = Field(ge=300, le=850)
    dti: float = Field(ge=0)
    risk_score: float = Field(ge=0, le=1)
    loan_amount: float = Field(gt=0)


async def credit_score(args: CreditScoreArgs) -> dict[str, Any]:
    """The bureau's score: known for the sample applicants, stable for anyone else."""
    score = _BUREAU.get(args.applicant_id)
    if score is None:
        digest = hashlib.sha256(args.applicant_id.encode()).digest()
        score = 520 + int.from_bytes(digest[:2], "big") % 300
    return {"applicantId": args.applicant_id, "score": score, "bureau": "Equinox"}


async def risk_model(args: RiskModelArgs) -> dict[str, Any]:
    """Probability of default from the selected risk model."""
    base = 0.02 if args.model_id == "standard-v2" else 0.05
    pd = base + (780 - args.credit_score) / 1000 + args.loan_amount / 2_000_000
    pd = round(min(0.9, max(0.01, pd)), 3)
    risk = "low" if pd < 0.1 else "medium" if pd < 0.2 else "high"
    return {"modelId": args.model_id, "risk": risk, "score": pd}


def debt_to_income(args: DebtToIncomeArgs) -> dict[str, Any]:
    return {"dti": round(args.monthly_debt / args.monthly_income, 3)}


SCORE_FLOOR = 580
"""Below this credit score, decline."""
AUTO_APPROVE_SCORE = 700
"""From this credit score (and within the other bands), approve without an underwriter."""


def lending_policy(args: LendingPolicyArgs) -> dict[str, Any]:
    reasons: list[str] = []
    codes: list[str] = []
    if args.credit_score < SCORE_FLOOR:
        reasons.append(f"credit score {args.credit_score} is below the floor of {SCORE_FLOOR}")
        codes.append("SCORE_BELOW_FLOOR")
    if args.dti > 0.5:
        reasons.append(f"debt-to-income {args.dti:.3f} exceeds the ceiling of 0.50")
        codes.append("DTI_ABOVE_CEILING")
    if args.risk_score >= 0.25:
        reasons.append(f"default probability {args.risk_score:.3f} is at or above 0.25")
        codes.append("DEFAULT_RISK_TOO_HIGH")
    if reasons:
        return {"decision": "decline", "policyVersion": POLICY_VERSION, "reasons": reasons,
                "reasonCodes": codes}
    if (
        args.credit_score >= AUTO_APPROVE_SCORE
        and args.dti <= 0.36
        and args.risk_score < 0.1
        and args.loan_amount <= 50_000
    ):
        reasons.append("score, debt-to-income and default probability within auto-approve bands")
        return {"decision": "approve", "policyVersion": POLICY_VERSION, "reasons": reasons,
                "reasonCodes": []}
    if args.credit_score < AUTO_APPROVE_SCORE:
        reasons.append(f"credit score {args.credit_score} is below the auto-approve band of "
                       f"{AUTO_APPROVE_SCORE}")
    if args.dti > 0.36:
        reasons.append(f"debt-to-income {args.dti:.3f} is above the auto-approve band of 0.36")
    if args.risk_score >= 0.1:
        reasons.append(f"default probability {args.risk_score:.3f} needs underwriter review")
    if args.loan_amount > 50_000:
        reasons.append("amount above the auto-approve limit of 50,000")
    codes = [code for code, applies in (
        ("SCORE_BELOW_AUTO_APPROVE", args.credit_score < AUTO_APPROVE_SCORE),
        ("DTI_ABOVE_AUTO_APPROVE", args.dti > 0.36),
        ("DEFAULT_RISK_NEEDS_REVIEW", args.risk_score >= 0.1),
        ("AMOUNT_ABOVE_AUTO_APPROVE", args.loan_amount > 50_000)) if applies]
    return {"decision": "refer", "policyVersion": POLICY_VERSION, "reasons": reasons,
            "reasonCodes": codes}


class LoanFigures(CamelModel):
    credit_score: int
    debt_to_income: float
    default_probability: float
    risk_band: Literal["low", "medium", "high"]


class LoanDecision(CamelModel):
    """The loan officer's answer."""

    decision: Literal["approve", "refer", "decline"]
    applicant_id: str = Field(description="The applicant decided on (the case's own).")
    reason_codes: list[str] = Field(default_factory=list, description=(
        "The lending policy's reason codes for the decision (a decline has at least one)."))
    rationale: str = Field(min_length=1, max_length=4000, description="Citing the figures.")
    figures: LoanFigures | None = None


def _policy_consulted(case: CheckContext) -> tuple[bool, str]:
    """An approve or a decline stands only on the lending policy's answer."""
    decision = case.answer["decision"]
    answered = [c for c in case.calls_to("lending-policy") if c.get("error") is None]
    if not answered:
        return decision == "refer", (
            "refer without the lending policy: a person decides" if decision == "refer"
            else f"{decision} without consulting lending-policy")
    policy = answered[-1]["toolResult"]
    if decision != "refer" and policy["decision"] != decision:
        return False, f"{decision}, where lending-policy {policy['policyVersion']} returned " \
                      f"{policy['decision']}"
    return True, f"lending-policy {policy['policyVersion']} returned {policy['decision']}"


def _names_the_applicant(case: CheckContext) -> tuple[bool, str]:
    """Every tool call and the answer are about this case's applicant."""
    applicant = case.input["applicantId"]
    others = sorted({str(c["toolArgs"]["applicantId"]) for c in case.tool_calls
                     if isinstance(c.get("toolArgs"), dict)
                     and c["toolArgs"].get("applicantId", applicant) != applicant})
    if case.answer["applicantId"] != applicant:
        others.append(f"the answer names {case.answer['applicantId']}")
    if others:
        return False, f"this case is {applicant}'s, but: {', '.join(others)}"
    return True, f"every call and the answer name {applicant}"


def _decline_has_reasons(case: CheckContext) -> tuple[bool, str]:
    if case.answer["decision"] != "decline":
        return True, f"{case.answer['decision']}: no reason code needed"
    codes = case.answer.get("reasonCodes") or []
    return bool(codes), ", ".join(codes) if codes else "a decline without a reason code"


CHECKS = (
    Check("lending-policy-consulted", "1", _policy_consulted),
    Check("names-the-applicant", "1", _names_the_applicant),
    Check("decline-has-reason-code", "1", _decline_has_reasons),
)


def _final(text: str, answer: dict[str, Any]) -> AssistantTurn:
    return AssistantTurn(text=text, tool_calls=(call(FINAL_ANSWER, "final", **answer),))


def think(messages: Sequence[ChatMessage]) -> AssistantTurn:
    """The loan officer's scripted reasoning, one turn from the conversation so far."""
    app = case_input(messages)
    seen = observed(messages)
    applicant = app["applicantId"]
    failures = errors_in(seen)
    if failures:
        return _final(
            "A tool I need did not answer: " + "; ".join(failures)
            + ". I cannot decide without it, so I refer the application to an underwriter.",
            {
                "decision": "refer",
                "applicantId": applicant,
                "rationale": "Referred: missing evidence (" + "; ".join(failures) + ").",
            },
        )
    if "credit-score" not in seen:
        return AssistantTurn(
            text=(
                f"Reviewing loan application {applicant} from {app['applicantName']}: "
                f"{app['loanAmount']:,} over {app['termMonths']} months for {app['purpose']}. "
                "I need the applicant's credit score before anything else."
            ),
            tool_calls=(call("credit-score", "call-1", applicantId=applicant),),
        )
    score = seen["credit-score"]["score"]
    model_id = "standard-v2" if score >= 650 else "subprime-v1"
    if "risk-model-retrieval" not in seen:
        return AssistantTurn(
            text=(
                f"The credit score is {score}. I should now retrieve the risk model "
                f"({model_id}) and compute the debt-to-income ratio from the stated "
                "income and debts."
            ),
            tool_calls=(
                call(
                    "risk-model-retrieval", "call-2", modelId=model_id, creditScore=score,
                    loanAmount=app["loanAmount"],
                ),
                call(
                    "debt-to-income", "call-3", monthlyDebt=app["monthlyDebt"],
                    monthlyIncome=app["monthlyIncome"],
                ),
            ),
        )
    risk = seen["risk-model-retrieval"]
    dti = seen["debt-to-income"]["dti"]
    if "lending-policy" not in seen:
        return AssistantTurn(
            text=(
                f"Risk model {risk['modelId']} puts the default probability at {risk['score']} "
                f"({risk['risk']}); the debt-to-income ratio is {dti}. I will check these "
                "figures against the lending policy."
            ),
            tool_calls=(
                call(
                    "lending-policy", "call-4", creditScore=score, dti=dti,
                    riskScore=risk["score"], loanAmount=app["loanAmount"],
                ),
            ),
        )
    policy = seen["lending-policy"]
    decision = policy["decision"]
    rationale = (
        f"Credit score {score}, debt-to-income {dti}, default probability {risk['score']} "
        f"({risk['risk']}, {risk['modelId']}); policy {policy['policyVersion']}: "
        + "; ".join(policy["reasons"]) + "."
    )
    return _final(
        f"Lending policy {policy['policyVersion']} returns {decision}. {rationale}",
        {
            "decision": decision,
            "applicantId": applicant,
            "reasonCodes": policy["reasonCodes"],
            "rationale": rationale,
            "figures": {
                "creditScore": score,
                "debtToIncome": dti,
                "defaultProbability": risk["score"],
                "riskBand": risk["risk"],
            },
        },
    )


CAPABILITIES: tuple[Capability[Any], ...] = (
    Capability("credit-score", CreditScoreArgs, credit_score),
    Capability("risk-model-retrieval", RiskModelArgs, risk_model),
)

LOAN_OFFICER = AgentProfile(
    name="loan-officer",
    description=(
        "Evaluates a consumer loan application and decides approve, refer or decline, "
        "citing the credit score, debt-to-income ratio and default probability it used."
    ),
    system_prompt=(
        "You are a loan officer. Evaluate the application with your tools: fetch the "
        "credit score, retrieve the risk model, compute the debt-to-income ratio, check the "
        "lending policy. Give your decision by calling final_answer: decision (approve, refer "
        "or decline), applicantId, the policy's reasonCodes, a rationale citing the figures, "
        "figures."
    ),
    tools=(
        WorkerTool("credit-score", "The applicant's credit bureau score.", "credit-score",
                   CreditScoreArgs, read_only=True),
        WorkerTool("risk-model-retrieval", "Probability of default from a named risk model.",
                   "risk-model-retrieval", RiskModelArgs, read_only=True),
        LocalTool("debt-to-income", "Monthly debt divided by monthly income.",
                  DebtToIncomeArgs, debt_to_income),
        LocalTool("lending-policy", "The bank's lending policy applied to the figures.",
                  LendingPolicyArgs, lending_policy),
    ),
    input_model=LoanApplication,
    default_model=ModelRef(provider="scripted", name="loan-officer-scripted"),
    default_limits=Limits(max_cycles=8, deadline_seconds=60),
    script=think,
    capabilities=CAPABILITIES,
    version="1.2.0",
    answer_model=LoanDecision,
    checks=CHECKS,
    keys=("applicantId",),
    review=Review(decisions=frozenset({"refer"})),
)
