"""Review: a person decides a case waiting for one (``POST /cases/{id}/review``), and
the queue of cases that wait (``GET /reviews``). Each route parses the request, calls
the operation (service/cases/reviewing.py) and writes its answer."""

from __future__ import annotations

import uuid
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query, Response

from casetrail.api.deps import AnyKey, Cases, ReviewerKey, known_query_only
from casetrail.api.problems import responses
from casetrail.api.routes.cases import OrjsonResponse
from casetrail.api.schemas import (
    AnswerRequest,
    ReviewAccepted,
    ReviewItem,
    ReviewList,
    ReviewRequest,
)
from casetrail.cases import reviewing

router = APIRouter(dependencies=[Depends(known_query_only)])


@router.post("/cases/{case_id}/review", status_code=202, summary="Review a case awaiting it",
             response_model=ReviewAccepted,
             responses=responses(202, ReviewAccepted, "The review is kept; the case goes on "
                                 "from it", 400, 401, 403, 404, 410, 409, 413, 422, 503))
async def review_case(case_id: uuid.UUID, request: ReviewRequest, principal: ReviewerKey,
                      services: Cases) -> Response:
    """Confirm the agent's decision, override it (``decision``, valid for the agent's
    answer schema), or return the case to the model with your reason as its note. Needs
    ``cases:review``, held by a person, never the one who started the case (four eyes);
    one review per wait (a second is a 409). The worker records ``CASE_REVIEWED`` with
    you as the reviewer, then the case's end (``decidedBy: reviewer``) or more cycles."""
    done = await reviewing.review(services, principal, case_id, request.verdict,
                                  request.reason, request.decision)
    return OrjsonResponse({"caseId": str(done.case_id), "verdict": done.verdict,
                           "reviewer": done.reviewer, "status": "reviewed"}, status_code=202)


@router.post("/cases/{case_id}/answer", status_code=202,
             summary="Answer the question the model asked a person", response_model=ReviewAccepted,
             responses=responses(202, ReviewAccepted, "The answer is kept; the case goes on "
                                 "from it", 400, 401, 403, 404, 410, 409, 413, 422, 503))
async def answer_question(case_id: uuid.UUID, request: AnswerRequest, principal: ReviewerKey,
                          services: Cases) -> Response:
    """The model called ``ask_a_person``; the case waits for your answer. Needs
    ``cases:review`` (a person, never the one who started the case); one answer per
    question (a second is a 409). The next attempt records the waiting turn's
    ``REACT_CYCLE`` with your answer as the question's result (``answeredBy``: you)."""
    done = await reviewing.answer(services, principal, case_id, request.call_id,
                                  request.answer)
    return OrjsonResponse({"caseId": str(done.case_id), "verdict": done.verdict,
                           "reviewer": done.reviewer, "status": "answered"}, status_code=202)


@router.get("/reviews", summary="Cases awaiting review, oldest first", response_model=ReviewList,
            responses=responses(200, ReviewList, "The tenant's cases waiting for a person",
                                401, 403, 422, 503))
async def list_reviews(
    principal: AnyKey, services: Cases,
    agent: Annotated[str | None, Query(max_length=100)] = None,
    decision: Annotated[str | None, Query(max_length=100, description=(
        "The agent's decision that waits (e.g. refer)."))] = None,
    checks: Annotated[Literal["failed"] | None, Query(description=(
        "`failed`: only cases where one of the agent's checks failed."))] = None,
    overdue: Annotated[bool | None, Query(description=(
        "`true`: only reviews past their due time; `false`: only those within it."))] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> Response:
    found = await reviewing.open_reviews(services, principal, agent=agent, decision=decision,
                                         checks_failed=True if checks else None,
                                         overdue=overdue, limit=limit)
    return OrjsonResponse({"reviews": found})


@router.get("/reviews/{case_id}", summary="One case awaiting review", response_model=ReviewItem,
            responses=responses(200, ReviewItem, "The case, its waiting answer and checks",
                                401, 403, 404, 410, 422, 503))
async def get_review(case_id: uuid.UUID, principal: AnyKey, services: Cases) -> Response:
    return OrjsonResponse(await reviewing.one_review(services, principal, case_id))
