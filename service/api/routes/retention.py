"""Retention and legal holds: the tenant's policies (``/retention/policies``), the dates
business keys count from, the plan of what the next passes would do, and holds
(``/holds``). Each route parses the request, calls the operation
(service/cases/retention.py) and writes its answer."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Response

from casetrail.api.deps import AnyKey, Cases, known_query_only
from casetrail.api.problems import responses
from casetrail.api.routes.cases import OrjsonResponse
from casetrail.api.schemas import (
    BusinessDateKept,
    HoldList,
    HoldReleased,
    HoldView,
    PolicyList,
    PolicyView,
    RetentionPlan,
)
from casetrail.cases import retention
from casetrail.cases.requests import (
    BusinessDateRequest,
    HoldOnCase,
    HoldOnKey,
    HoldRequest,
    PolicyRequest,
    ReleaseRequest,
)

router = APIRouter(dependencies=[Depends(known_query_only)])

AgentName = Annotated[str, Path(max_length=100, description="An agent, or * for the "
                                "tenant's default.")]


@router.get("/retention/policies", summary="The tenant's retention policies, every version",
            response_model=PolicyList,
            responses=responses(200, PolicyList, "The floor, the presets and every version, "
                                "newest first", 401, 403, 422, 503))
async def list_policies(principal: AnyKey, services: Cases) -> Response:
    """Needs ``retention:manage`` or ``cases:read``. With no policy, everything is kept."""
    return OrjsonResponse(await retention.policies(services, principal))


@router.put("/retention/policies/{agent}", status_code=201,
            summary="Set a new version of a retention policy", response_model=PolicyView,
            responses=responses(201, PolicyView, "The version kept: in force, or waiting for a "
                                "second person", 400, 401, 403, 409, 413, 422, 503))
async def set_policy(agent: AgentName, request: PolicyRequest, principal: AnyKey,
                     services: Cases) -> Response:
    """Needs ``retention:manage``. A version that keeps less than the one in force (or
    deletes where everything was kept) is in force only once another person approves it
    (``needsSecondPerson``); every version is kept, with who set it and why."""
    asked = request.model_dump(exclude_unset=True)
    asked.setdefault("reason", request.reason)
    return OrjsonResponse(await retention.set_policy(services, principal, agent, asked),
                          status_code=201)


@router.post("/retention/policies/{policy_id}/approve",
             summary="Approve a policy that shortens what is kept (a second person)",
             response_model=PolicyView,
             responses=responses(200, PolicyView, "Approved: the version is in force", 401, 403,
                                 404, 409, 422, 503))
async def approve_policy(policy_id: Annotated[int, Path(ge=1)], principal: AnyKey,
                         services: Cases) -> Response:
    """Needs ``retention:manage``, held by a person other than the one who set it."""
    return OrjsonResponse(await retention.approve_policy(services, principal, policy_id))


@router.post("/retention/business-dates", status_code=201,
             summary="Set when the relationship a business key names ended",
             response_model=BusinessDateKept,
             responses=responses(201, BusinessDateKept, "Kept", 400, 401, 403, 413, 422,
                                 503))
async def set_business_date(request: BusinessDateRequest, principal: AnyKey,
                            services: Cases) -> Response:
    """Needs ``retention:manage``. A policy counted from ``business_date`` counts each
    case with this key from this date (the newest set counts). A sensitive field's value
    is kept as its keyed digest."""
    return OrjsonResponse(await retention.set_business_date(
        services, principal, request.field, request.value, request.ended_on), status_code=201)


@router.get("/retention/plan", summary="What retention would do now (a dry run)",
            response_model=RetentionPlan,
            responses=responses(200, RetentionPlan, "The tenant's cases past their time, oldest "
                                "first, and which a hold keeps", 401, 403, 422, 503))
async def plan(principal: AnyKey, services: Cases,
               limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> Response:
    return OrjsonResponse(await retention.plan(services, principal, limit))


@router.post("/holds", status_code=201, summary="Place a legal hold", response_model=HoldView,
             responses=responses(201, HoldView, "The hold, in force at once", 400, 401, 403, 404,
                                 413, 422, 503))
async def place_hold(request: HoldRequest, principal: AnyKey, services: Cases) -> Response:
    """Needs ``holds:manage``. On a case, on a business key (every case with it, present
    and future) or on the whole tenant; a held case is neither expired nor erased (the
    database refuses). It ends at ``endsAt`` or when two persons have released it."""
    key = (request.key.field, request.key.value) if isinstance(request, HoldOnKey) else None
    case_id = request.case_id if isinstance(request, HoldOnCase) else None
    return OrjsonResponse(await retention.place_hold(
        services, principal, request.scope, case_id, key, request.reason, request.ends_at),
        status_code=201)


@router.get("/holds", summary="The tenant's legal holds, newest first", response_model=HoldList,
            responses=responses(200, HoldList, "Holds with their releases", 401, 403, 422, 503))
async def list_holds(principal: AnyKey, services: Cases,
                     active: Annotated[bool, Query(description="Only holds in force.")] = True,
                     case_id: Annotated[uuid.UUID | None, Query(
                         alias="caseId", description="Only holds that keep this case.")
                     ] = None) -> Response:
    """Needs ``holds:manage`` or ``cases:read``."""
    return OrjsonResponse({"holds": await retention.holds(services, principal,
                                                          active_only=active,
                                                          case_id=case_id)})


@router.post("/holds/{hold_id}/release", summary="Release a legal hold (two persons)",
             response_model=HoldReleased,
             responses=responses(200, HoldReleased, "Your release kept; released once two persons "
                                 "have", 400, 401, 403, 404, 409, 413, 422, 503))
async def release_hold(hold_id: uuid.UUID, request: ReleaseRequest, principal: AnyKey,
                       services: Cases) -> Response:
    """Needs ``holds:manage``, held by a person. The hold ends with the second person's
    release."""
    return OrjsonResponse(await retention.release_hold(services, principal, hold_id,
                                                       request.reason))
