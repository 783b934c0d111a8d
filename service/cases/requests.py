"""What a caller asks of a case operation: the bodies of ``POST /cases`` and of a
cancel, validated by pydantic at every front."""

from __future__ import annotations

import uuid
from datetime import date, datetime
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field

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


def _text_only(value: Any) -> Any:
    """A date or time in a body is ISO 8601 text, never a number of seconds."""
    if not isinstance(value, str):
        raise ValueError("an ISO 8601 date or date-time, as text")
    return value


Day = Annotated[date, BeforeValidator(_text_only)]
Moment = Annotated[datetime, BeforeValidator(_text_only)]


class PolicyRequest(CamelModel):
    """A new version of a retention policy (``PUT /retention/policies/{agent}``)."""

    model_config = {"json_schema_extra": {"examples": [
        {"preset": "ai-act-minimum", "reason": "Loan decisions: the AI Act's minimum."},
        {"keepDays": 2192, "personalDataDays": 365, "reason": "Six years; personal data "
         "one year after the decision."},
        {"preset": "amlr", "businessKey": "customerId",
         "reason": "AML records: five years after the relationship ends."}]}}

    preset: str | None = Field(default=None, max_length=100, description="A preset "
                               "(GET /retention/policies lists them, with their source); "
                               "the fields below change what it says.")
    keep_days: int | None = Field(default=None, ge=183, le=36_500, description=(
        "How long a decided case is kept, in days; null keeps it for good. At least the "
        "floor (183 days, or more where the operator raised it)."))
    business_key: str | None = Field(default=None, max_length=100, description=(
        "Count from the date set for the case's value of this business key (POST "
        "/retention/business-dates: the end of a customer relationship) instead of from "
        "the case's terminal event. A case whose key has no date set is kept."))
    personal_data_days: int | None = Field(default=None, ge=1, le=36_500, description=(
        "How long its personal data (sealed sensitive values) is kept; never longer than "
        "the case itself (a larger value means: with the case)."))
    archive: bool = Field(default=False, strict=True, description=(
        "Archive each case's bundle before it expires (a signed manifest per batch; "
        "`casetrail archive verify` checks it offline). Dropping it later takes a second "
        "person."))
    reason: str = Field(min_length=1, max_length=2000, description="Why; kept with the "
                        "version.")


class BusinessDateRequest(CamelModel):
    """When the relationship a business key names ended (``POST /retention/business-dates``)."""

    field: str = Field(min_length=1, max_length=100, description="A business key field.")
    value: str = Field(min_length=1, max_length=300)
    ended_on: Day


class HoldKey(CamelModel):
    field: str = Field(min_length=1, max_length=100, description="A business key field.")
    value: str = Field(min_length=1, max_length=300)


class _Hold(CamelModel):
    reason: str = Field(min_length=1, max_length=2000)
    ends_at: Moment | None = Field(default=None, description="When the hold ends by "
                                     "itself; none: until two persons release it.")


class HoldOnCase(_Hold):
    """Hold one case."""

    model_config = {"json_schema_extra": {"examples": [
        {"scope": "case", "caseId": "0b9c1f8e-3f4a-4d7e-9a51-0c2f3e4d5a6b",
         "reason": "Complaint 2026-114: keep until resolved."}]}}

    scope: Literal["case"]
    case_id: uuid.UUID


class HoldOnKey(_Hold):
    """Hold every case with a business key's value, present and future."""

    model_config = {"json_schema_extra": {"examples": [
        {"scope": "business_key", "key": {"field": "applicantId", "value": "A-1001"},
         "reason": "Litigation hold, matter 88-2026."}]}}

    scope: Literal["business_key"]
    key: HoldKey


class HoldOnTenant(_Hold):
    """Hold every case of the tenant."""

    scope: Literal["tenant"]


HoldRequest = Annotated[HoldOnCase | HoldOnKey | HoldOnTenant, Field(discriminator="scope")]
"""A legal hold (``POST /holds``)."""


class ReleaseRequest(CamelModel):
    reason: str = Field(min_length=1, max_length=2000)


class BacktestRequest(CamelModel):
    """A backtest to run (``POST /backtests``): a challenger over the agent's decided cases."""

    model_config = {"json_schema_extra": {"examples": [
        {"agent": "loan-officer", "since": "2026-11-01T00:00:00Z", "limit": 500},
        {"agent": "loan-officer", "challenger": "loan-officer",
         "model": {"provider": "openai", "name": "gpt-4.1-mini"}, "maxTokens": 2_000_000}]}}

    agent: str = Field(min_length=1, max_length=100, description="The agent whose decided "
                       "cases are run again (the champion).")
    challenger: str | None = Field(default=None, max_length=200, description=(
        "An installed agent, NAME or NAME@VERSION (the version installed must be that one); "
        "default: the agent itself, as installed now. Never code a request names."))
    model: ModelRef | None = Field(default=None, description="The challenger's model "
                                   "(default: the challenger's own).")
    since: Moment | None = Field(default=None, description="Cases created at or after this "
                                   "time (RFC 3339, with its offset).")
    until: Moment | None = Field(default=None, description="Cases created before this time.")
    cases: list[uuid.UUID] | None = Field(default=None, max_length=100_000, description=(
        "Only these cases (of the agent, decided)."))
    limit: int = Field(default=1000, ge=1, le=100_000, description="At most this many cases, "
                       "oldest first.")
    concurrency: int = Field(default=4, ge=1, le=64,
                             description="Cases run at once.")
    max_tokens: int | None = Field(default=None, ge=1, description=(
        "Start no further case once the challenger used this many tokens."))
    max_seconds: float | None = Field(default=None, gt=0, le=86_400, description=(
        "Start no further case after this many seconds."))
    tool_policy: Literal["refuse", "live"] = Field(default="refuse", description=(
        "A worker tool call the record does not hold: refused (an error the challenger "
        "sees, counted and listed), or, with live, asked of the tool itself when it is "
        "declared read-only (counted and listed; any other is still refused)."))
