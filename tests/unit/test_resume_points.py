"""Where an attempt begins, from the record before it: the engine's resume rules."""

from __future__ import annotations

import uuid

import pytest
from pydantic import BaseModel

from casetrail.contract.events import (
    Limits,
    ModelRef,
    PendingQuestion,
    ResumedFrom,
    TokenUsage,
)
from casetrail.engine.answers import Answering
from casetrail.engine.case import CaseSpec, Parked, Resume, Resumption, resume_point


class Decision(BaseModel):
    decision: str


QUESTION = PendingQuestion(call_id="ask-1", question="Is the payslip genuine?",
                           question_index=0, reasoning_text="I need a person.", tool_calls=(),
                           token_usage=TokenUsage(input_tokens=1, output_tokens=1))


def spec(parked: Parked | None = None, answer: dict[str, str] | None = None,
         resumed: bool = True) -> CaseSpec:
    resumption = Resumption(
        resumed_from=ResumedFrom(attempt=1, seq=3, cycles=2), messages=(), cycles=2,
        usage=TokenUsage(input_tokens=10, output_tokens=2), answer=answer, parked=parked)
    return CaseSpec(case_id=uuid.uuid4(), attempt=2, agent="loan-officer", system_prompt="",
                    input={}, limits=Limits(max_cycles=3, deadline_seconds=10),
                    model=ModelRef(provider="scripted", name="s"),
                    resumption=resumption if resumed else None,
                    answering=Answering(Decision))


WAITING_FOR_REVIEW = Parked(attempt=1, answer={"decision": "refer"}, checks=())
WAITING_ON_QUESTION = Parked(attempt=1, answer=None, checks=(), question=QUESTION)


@pytest.mark.parametrize(("case", "cancelled", "where"), [
    (spec(resumed=False), False, Resume.FRESH),
    (spec(resumed=False), True, Resume.FRESH),
    (spec(), False, Resume.FRESH),
    (spec(WAITING_FOR_REVIEW), False, Resume.REVIEWED),
    (spec(WAITING_ON_QUESTION), False, Resume.ANSWERED),
    (spec(WAITING_FOR_REVIEW), True, Resume.CANCELLED_WHILE_WAITING),
    (spec(WAITING_ON_QUESTION), True, Resume.CANCELLED_WHILE_WAITING),
    (spec(answer={"decision": "approve"}), False, Resume.ANSWER_UNJUDGED),
    (spec(answer={"decision": "approve"}), True, Resume.FRESH),
], ids=["first", "first-cancelled", "mid-loop", "reviewed", "answered",
        "review-cancelled", "question-cancelled", "unjudged", "unjudged-cancelled"])
def test_where_an_attempt_begins(case: CaseSpec, cancelled: bool, where: Resume) -> None:
    assert resume_point(case, cancelled) is where
