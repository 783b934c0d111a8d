"""What a route declares it needs, as dependency aliases: who may call it (the scope
each alias requires) and the case services (``app.state.cases``)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.dependencies.models import Dependant

from casetrail.api.security import anyone, requires
from casetrail.cases.errors import Invalid, Issue
from casetrail.cases.services import CaseServices
from casetrail.contract.auth import Principal, Scope


def _query_names(dependant: Dependant) -> frozenset[str]:
    names = {parameter.alias for parameter in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _query_names(sub)
    return frozenset(names)


_DECLARED: dict[int, tuple[frozenset[str], tuple[str, ...]]] = {}


def _declared(route: Any) -> tuple[frozenset[str], tuple[str, ...]]:
    """A route's query parameters: those its signature declares, those it reads itself
    (``casetrail_query``), and the prefixes it reads (``casetrail_query_prefixes``);
    worked out once per route."""
    found = _DECLARED.get(id(route))
    if found is None:
        endpoint = route.endpoint
        found = _DECLARED[id(route)] = (
            _query_names(route.dependant) | frozenset(getattr(endpoint, "casetrail_query", ())),
            tuple(getattr(endpoint, "casetrail_query_prefixes", ())))
    return found


async def known_query_only(request: Request) -> None:
    """A query parameter the route does not take is a 422 naming it, never ignored (a
    search by an unknown field would otherwise answer every case)."""
    route = request.scope.get("route")
    if route is None:
        return
    if not request.query_params:
        return
    names, prefixes = _declared(route)
    unknown = [name for name in request.query_params
               if name not in names and not name.startswith(prefixes or ("\0",))]
    if unknown:
        raise Invalid(*(Issue(("query", name), "not a parameter of this route; it takes: "
                              + (", ".join(sorted(names)) or "none")) for name in unknown))


async def _cases(request: Request) -> CaseServices:
    # async: FastAPI runs a plain ``def`` dependency in a thread, a handoff per request.
    cases: CaseServices = request.app.state.cases
    return cases


Cases = Annotated[CaseServices, Depends(_cases)]

Reader = Annotated[Principal, Depends(requires(Scope.READ))]
Starter = Annotated[Principal, Depends(requires(Scope.START))]
Canceller = Annotated[Principal, Depends(requires(Scope.CANCEL))]
ReviewerKey = Annotated[Principal, Depends(requires(Scope.REVIEW))]
Administrator = Annotated[Principal, Depends(requires(Scope.ADMIN))]
AnyKey = Annotated[Principal, Depends(requires())]
Public = Annotated[Principal, Depends(anyone())]
