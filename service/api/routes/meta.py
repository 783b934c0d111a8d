"""What the API says about itself: the agents, who the caller is, the signing keys,
the bus's AsyncAPI document, liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response

from casetrail.agents import AGENTS
from casetrail.api.deps import AnyKey, Cases, Public, known_query_only
from casetrail.api.problems import responses
from casetrail.api.routes.cases import OrjsonResponse
from casetrail.api.schemas import (
    AgentList,
    AsyncApiDocument,
    Health,
    Identity,
    Readiness,
    SigningKeys,
)
from casetrail.cases import offered
from casetrail.errors import CasetrailError

router = APIRouter(dependencies=[Depends(known_query_only)])


@router.get("/agents", summary="The agent profiles", response_model=AgentList,
            responses=responses(200, AgentList, "Every agent a case may name", 401, 503))
async def agents(request: Request, _: AnyKey) -> Response:
    return OrjsonResponse({"agents": [AGENTS[name].describe()
                                      for name in offered(request.app.state.settings)]})


@router.get("/me", summary="Who the credentials act as", response_model=Identity,
            responses=responses(200, Identity, "The tenant, subject and scopes", 401, 503))
async def me(principal: AnyKey) -> Response:
    return OrjsonResponse({"tenant": principal.tenant, "subject": principal.subject,
                           "scopes": sorted(principal.scopes),
                           **({} if principal.person is None else {"person": principal.person})})


@router.get("/signing-keys", summary="The public keys events are signed with",
            response_model=SigningKeys,
            responses=responses(200, SigningKeys, "Every registered key, retired ones too", 503))
async def signing_keys(services: Cases, _: Public) -> Response:
    return OrjsonResponse({"keys": await services.evidence.keys.describe()})


@router.get("/asyncapi.json", summary="The bus, as an AsyncAPI 3.0 document",
            response_model=AsyncApiDocument,
            responses=responses(200, AsyncApiDocument, "Channels, operations, messages"))
async def asyncapi(request: Request, _: Public) -> Response:
    return OrjsonResponse(request.app.state.asyncapi)


@router.get("/healthz", summary="The process is alive", response_model=Health,
            responses=responses(200, Health, "Alive"))
async def healthz(_: Public) -> Response:
    return OrjsonResponse({"status": "ok"})


@router.get("/readyz", summary="Broker and database are reachable", response_model=Readiness,
            responses=responses(200, Readiness, "Ready") | {
                503: {"model": Readiness, "description": "Broker or database unreachable"}})
async def readyz(request: Request, services: Cases, _: Public) -> Response:
    """Ready means the broker and the database answer; ``log`` says whether the
    transparency log still vouches for what it serves (a halt does not make the API
    unready: cases are still started and read)."""
    checks: dict[str, str] = {}
    state = None
    try:
        await services.store.ping()
        checks["database"] = "ok"
        state = await request.app.state.log.state(await services.ledger.latest())
    except CasetrailError:
        checks["database"] = "unreachable"  # no internal error text on a public route
    checks["broker"] = "ok" if not services.connection.is_closed and \
        not services.publisher.channel.is_closed else "disconnected"
    ready = all(v == "ok" for v in checks.values())
    return OrjsonResponse({"ready": ready, "checks": checks,
                           **({"log": state.as_json()} if state is not None else {})},
                          status_code=200 if ready else 503)
