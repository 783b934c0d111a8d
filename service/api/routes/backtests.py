"""Backtests (docs/backtests.md): ask for one, follow it, read what it found and take its
offline evidence. Each route parses the request, calls the operation
(service/cases/backtests.py) and writes its answer."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Response

from casetrail.api.deps import AnyKey, Cases, known_query_only
from casetrail.api.problems import error_responses, responses
from casetrail.api.routes.cases import OrjsonResponse
from casetrail.api.schemas import BacktestBundle, BacktestList, BacktestView
from casetrail.cases import backtests
from casetrail.cases.requests import BacktestRequest

router = APIRouter(dependencies=[Depends(known_query_only)])


@router.post("/backtests", status_code=202, summary="Run a challenger over recorded cases",
             response_model=BacktestView,
             responses=responses(202, BacktestView, "Kept: a worker runs it (follow "
                                 "Location)", 400, 401, 403, 413, 422, 503))
async def ask_backtest(request: BacktestRequest, principal: AnyKey, services: Cases
                       ) -> Response:
    """Needs ``backtests:run``. The challenger (an installed agent version) runs from each
    selected case's recorded input with the model named; the record answers its worker
    tool calls, any other is refused. Nothing is written to the cases or their log; the
    backtest's own record is signed and enters the transparency log."""
    found = await backtests.ask(services, principal, request.model_dump(
        mode="json", by_alias=True, exclude_none=True))
    return OrjsonResponse(found, status_code=202,
                          headers={"Location": f"/backtests/{found['backtestId']}"})


@router.get("/backtests", summary="The newest backtests", response_model=BacktestList,
            responses=responses(200, BacktestList, "Newest first", 401, 403, 422, 503))
async def list_backtests(principal: AnyKey, services: Cases,
                         limit: Annotated[int, Query(ge=1, le=500)] = 50) -> Response:
    """Needs ``cases:read`` or ``backtests:run``."""
    return OrjsonResponse(await backtests.recent(services, principal, limit))


@router.get("/backtests/{backtest_id}", summary="A backtest: progress, then what it found",
            response_model=BacktestView,
            responses=responses(200, BacktestView, "The backtest", 401, 403, 404, 422, 503))
async def get_backtest(backtest_id: uuid.UUID, principal: AnyKey, services: Cases
                       ) -> Response:
    """Needs ``cases:read`` or ``backtests:run``. Once done: the decision matrix, agreement
    with reviewers, the cases whose decision changed and every per-case result, as its
    signed record names them."""
    return OrjsonResponse(await backtests.show(services, principal, backtest_id))


@router.get("/backtests/{backtest_id}/bundle", summary="A backtest's offline evidence",
            response_model=BacktestBundle,
            responses=responses(200, BacktestBundle, "casetrail-backtest/1: the signed record, its "
                                "results, the keys and its log proof", 401, 403, 404, 409,
                                422, 503))
async def backtest_bundle(backtest_id: uuid.UUID, principal: AnyKey, services: Cases
                          ) -> Response:
    """Needs ``cases:read`` or ``backtests:run``; ``casetrail verify-bundle`` checks it.
    409 until the backtest is done (a failed one has none)."""
    return OrjsonResponse(await backtests.evidence(services, principal, backtest_id), headers={
        "Content-Disposition": f'attachment; filename="casetrail-backtest-{backtest_id}.json"'})


@router.get("/backtests/{backtest_id}/report", summary="A backtest's PDF for the validation file",
            response_class=Response,
            responses={200: {"content": {"application/pdf": {"schema": {
                "type": "string", "format": "binary"}}},
                "description": "One PDF: what was run, the decision matrix, agreement with "
                               "reviewers, the changed cases, integrity; the bundle attached "
                               "(its SHA-256 printed and in X-Casetrail-Bundle-Sha256)"},
                **error_responses(401, 403, 404, 409, 422, 501, 503)})
async def backtest_report(backtest_id: uuid.UUID, principal: AnyKey, services: Cases
                          ) -> Response:
    """Needs ``cases:read`` or ``backtests:run``; 409 until the backtest is done."""
    pdf, digest = await backtests.report(services, principal, backtest_id)
    return Response(pdf, media_type="application/pdf", headers={
        "Content-Disposition": f'attachment; filename="casetrail-backtest-{backtest_id}.pdf"',
        "X-Casetrail-Bundle-Sha256": digest})
