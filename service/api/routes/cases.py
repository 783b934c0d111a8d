"""``/cases``: start, read, search, verify, export, cancel and erase a case. Each route
parses the request, calls the operation (service/cases/) and writes its answer; the
operation's refusals become problems (service/api/problems.py)."""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, Body, Depends, Header, Query, Request, Response

from casetrail import cases
from casetrail.adapters.store import utc_text
from casetrail.adapters.store.search import CURSOR_PATTERN
from casetrail.api.deps import (
    Administrator,
    Canceller,
    Cases,
    Reader,
    Starter,
    known_query_only,
)
from casetrail.api.problems import error_responses, responses
from casetrail.api.schemas import (
    Bundle,
    CancelAccepted,
    CancelRequest,
    CaseAccepted,
    CaseList,
    CaseRequest,
    CaseView,
    EraseAccepted,
    Trail,
    VerifyReport,
)
from casetrail.cases import reporting
from casetrail.contract.events import CaseStatus

router = APIRouter(dependencies=[Depends(known_query_only)])

INSTANT = (r"^([0-9]{3}[1-9]|[0-9]{2}[1-9]0|[0-9][1-9]00|[1-9]000)"
           r"-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])[Tt]([01][0-9]|2[0-3])"
           r":[0-5][0-9]:[0-5][0-9](\.[0-9]{1,9})?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$")
"""An RFC 3339 date-time: the offset is required (a bare local time is ambiguous)."""


class OrjsonResponse(Response):
    """JSON through orjson, returned directly by the routes so FastAPI's generic
    encoder stays off the hot path."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


@router.post("/cases", status_code=202, summary="Start a case", response_model=CaseAccepted,
             responses=responses(
                 202, CaseAccepted, "Accepted: the case is recorded and its start command "
                 "confirmed", 400, 401, 403, 409, 413, 422, 429, 503))
async def start_case(
    request: Annotated[CaseRequest, Body()], principal: Starter, services: Cases,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
) -> Response:
    """Validate, record the case as ``queued``, publish its start command with a
    confirm, then answer 202. A repeated ``Idempotency-Key`` returns the first case."""
    started = await cases.start(services, principal, request, idempotency_key)
    row, shown = started.case, str(started.case["case_id"])
    headers = {"Location": f"/cases/{shown}"}
    if not started.created:
        headers["Idempotency-Replayed"] = "true"
    return OrjsonResponse({
        "caseId": shown, "status": row["status"], "agent": row["agent"],
        "limits": row["limits"], "model": row["model"],
        "links": {"self": f"/cases/{shown}", "events": f"/cases/{shown}/events"},
    }, status_code=202, headers=headers)


@router.get("/cases/{case_id}", summary="A case's status, totals and answer",
            response_model=CaseView,
            responses=responses(200, CaseView, "The case", 401, 403, 404, 410, 422, 503))
async def get_case(case_id: uuid.UUID, principal: Reader, services: Cases) -> Response:
    return OrjsonResponse(await cases.get(services, principal, case_id))


@router.get("/cases/{case_id}/verify", summary="Whether the case's trail is intact",
            response_model=VerifyReport,
            responses=responses(200, VerifyReport,
                                "Every chain, signature and the completeness, checked",
                                401, 403, 404, 422, 503))
async def verify_case(case_id: uuid.UUID, principal: Reader, services: Cases) -> Response:
    return OrjsonResponse((await cases.verify(services, principal, case_id)).as_json())


@router.get("/cases/{case_id}/bundle", summary="The case as an offline bundle",
            response_model=Bundle,
            responses=responses(200, Bundle, "The events exactly as signed and the public keys "
                                "(check it with `casetrail verify-bundle`)",
                                401, 403, 404, 410, 422, 503))
async def bundle_case(case_id: uuid.UUID, principal: Reader, services: Cases) -> Response:
    return OrjsonResponse(await cases.export(services, principal, case_id), headers={
        "Content-Disposition": f'attachment; filename="casetrail-{case_id}.json"'})


@router.get("/cases/{case_id}/report", summary="The case as a PDF report",
            response_class=Response,
            responses={200: {"content": {"application/pdf": {"schema": {
                "type": "string", "format": "binary"}}},
                "description": "One PDF: the decision, checks, reviews, integrity and the "
                               "transparency log, how to verify it, every cycle; the evidence "
                               "bundle attached (its SHA-256 printed and in "
                               "X-Casetrail-Bundle-Sha256)"},
                       **error_responses(401, 403, 404, 410, 422, 429, 501, 503)})
async def report_case(case_id: uuid.UUID, principal: Reader, services: Cases) -> Response:
    made = await reporting.report(services, principal, case_id)
    return Response(made.pdf, media_type="application/pdf", headers={
        "Content-Disposition": f'attachment; filename="casetrail-{case_id}.pdf"',
        "X-Casetrail-Bundle-Sha256": made.bundle_sha256})


@router.get("/cases/{case_id}/events", summary="The case's trail, in order",
            response_model=Trail,
            responses=responses(200, Trail, "The trail in (attempt, seq) order",
                                401, 403, 404, 410, 422, 503))
async def get_events(case_id: uuid.UUID, request: Request, principal: Reader,
                     services: Cases) -> Response:
    # ``types`` is a comma-separated list (``?types=REACT_CYCLE,CASE_COMPLETED``), read
    # here and described in the OpenAPI document as an array of the event types, style
    # form, not exploded (service/api/openapi.py).
    types = request.query_params.get("types")
    return OrjsonResponse(await cases.events(services, principal, case_id,
                                             types.split(",") if types else None))


get_events.casetrail_query = ("types",)  # type: ignore[attr-defined]


@router.get("/cases", summary="Search the tenant's cases, newest first", response_model=CaseList,
            responses=responses(200, CaseList, "A page of cases and the next page's cursor",
                                401, 403, 422, 429, 503))
async def search_cases(
    principal: Reader, services: Cases, request: Request,
    agent: Annotated[str | None, Query(max_length=100)] = None,
    status: CaseStatus | None = None,
    decision: Annotated[str | None, Query(max_length=100, description=(
        "The answer's decision, for agents whose answer has one (e.g. approve)."))] = None,
    since: Annotated[str | None, Query(
        pattern=INSTANT, json_schema_extra={"format": "date-time"},
        description="Cases created at or after this instant (RFC 3339, with its offset).")
    ] = None,
    until: Annotated[str | None, Query(
        pattern=INSTANT, json_schema_extra={"format": "date-time"},
        description="Cases created before this instant (RFC 3339, with its offset).")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: Annotated[str | None, Query(pattern=CURSOR_PATTERN, description=(
        "The nextCursor of the previous page."))] = None,
    checks: Annotated[Literal["failed"] | None, Query(description=(
        "`failed`: only cases where one of the agent's checks failed."))] = None,
    key: Annotated[str | None, Query(max_length=300, description=(
        "A business key's value, in any of the agents' key fields (e.g. an applicant "
        "id); `key.<field>=VALUE` searches one field."))] = None,
) -> Response:
    keyed = {name[4:]: value for name, value in request.query_params.items()
             if name.startswith("key.")}
    return OrjsonResponse(await cases.search(
        services, principal, agent=agent, status=status, decision=decision, since=since,
        until=until, limit=limit, cursor=cursor, checks=checks, key=key, keyed=keyed))


search_cases.casetrail_query_prefixes = ("key.",)  # type: ignore[attr-defined]


@router.post("/cases/{case_id}/cancel", status_code=202, summary="Ask a case to stop",
             response_model=CancelAccepted,
             responses=responses(202, CancelAccepted, "The case is stopping or stopped",
                                 400, 401, 403, 404, 410, 409, 413, 422, 503))
async def cancel_case(
    case_id: uuid.UUID, principal: Canceller, services: Cases,
    request: Annotated[CancelRequest | None, Body()] = None,
) -> Response:
    await cases.cancel(services, principal, case_id, request.reason if request else None)
    return OrjsonResponse({"caseId": str(case_id), "status": "cancelling"}, status_code=202)


@router.post("/cases/{case_id}/erase", status_code=202,
             summary="Erase a case's sensitive values (crypto-shredding)",
             response_model=EraseAccepted,
             responses=responses(202, EraseAccepted,
                                 "The erasure is signed and recorded: the values are "
                                 "destroyed when its CASE_ERASED is stored",
                                 401, 403, 404, 410, 409, 422, 503))
async def erase_case(case_id: uuid.UUID, principal: Administrator, services: Cases) -> Response:
    """Destroy the case's data key and ciphertext, through its record: the erasure is
    signed for the caller, the worker appends the signed ``CASE_ERASED`` (who, when) and
    the database shreds the values as it stores that event. The trail keeps its
    placeholders and every hash still verifies. Only an ended case can be erased."""
    done = await cases.erase(services, principal, case_id)
    return OrjsonResponse({
        "caseId": str(case_id),
        "status": {"erased": "erased", "erasing": "erasing"}.get(done.outcome,
                                                                  "already erased"),
        "erasedAt": utc_text(done.erased_at)}, status_code=202)
