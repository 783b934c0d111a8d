"""What a caller asks of a case operation: the bodies of ``POST /cases`` and of a
cancel, validated by pydantic at every front."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from service.agents.profile import CamelModel
from service.events import ModelRef


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
