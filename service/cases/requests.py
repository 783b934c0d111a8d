"""What a caller asks of a case operation: the bodies of ``POST /cases`` and of a
cancel, validated by pydantic at every front."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from casetrail.agents.profile import CamelModel
from casetrail.contract.events import ModelRef


class LimitsRequest(CamelModel):
    """Overrides of the agent's default limits, within the server's caps."""

    max_cycles: int | None = Field(default=None, ge=1)
    deadline_seconds: float | None = Field(default=None, gt=0)
    max_answer_retries: int | None = Field(default=None, ge=0, le=10, description=(
        "Answers refused (not valid for the agent's answer schema) before the case fails "
        "with invalid_answer; default 2."))


class CaseRequest(CamelModel):
    """Start a case."""

    model_config = CamelModel.model_config | {
        "json_schema_extra": {
            "examples": [
                {
                    "agent": "loan-officer",
                    "input": {
                        "applicantId": "A-1001", "applicantName": "Maria Okafor",
                        "loanAmount": 25000, "termMonths": 60, "monthlyIncome": 9000,
                        "monthlyDebt": 2100, "purpose": "home improvement",
                    },
                    "limits": {"maxCycles": 8, "deadlineSeconds": 60},
                }
            ]
        }
    }

    agent: str = Field(description="An agent name from GET /agents.")
    input: dict[str, Any] = Field(description="Validated against the agent's input schema.")
    limits: LimitsRequest | None = None
    model: ModelRef | None = Field(default=None, description="Overrides the agent's model.")


class CancelRequest(CamelModel):
    reason: str | None = Field(default=None, max_length=1000)


class ReviewRequest(CamelModel):
    """A person's review of a case awaiting one."""

    model_config = {"json_schema_extra": {"examples": [
        {"verdict": "confirm", "reason": "Thin file; the referral stands as reasoned."},
        {"verdict": "override", "reason": "Verified income documents on file.",
         "decision": {"decision": "approve", "applicantId": "A-1001", "reasonCodes": [],
                      "rationale": "Income verified by the reviewer.", "figures": {}}},
        {"verdict": "return", "reason": "Check the second applicant's income too."}]}}

    verdict: Literal["confirm", "override", "return"] = Field(
        description="confirm the agent's decision, override it with `decision`, or return "
        "the case to the model with `reason` as a note (it runs more cycles and comes back).")
    reason: str = Field(min_length=1, max_length=4000, description="Why, in your words; "
                        "recorded in the trail.")
    decision: dict[str, Any] | None = Field(
        default=None, description="For override only: the decision, valid for the agent's "
        "answer schema (GET /agents).")


class AnswerRequest(CamelModel):
    """A person's answer to the question the model asked (``ask_a_person``)."""

    model_config = {"json_schema_extra": {"examples": [
        {"callId": "call_7", "answer": "Yes: the employer confirmed by phone on 2 Dec."}]}}

    call_id: str = Field(min_length=1, max_length=200, description="The question's tool call "
                         "id (GET /reviews shows it).")
    answer: str = Field(min_length=1, max_length=4000, description="Your answer; the model "
                        "reads it as the question's result, and the trail records who gave it.")
