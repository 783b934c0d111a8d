"""What a route declares it needs, as dependency aliases: who may call it (the scope
each alias requires) and the case services (``app.state.cases``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from service.api.security import anyone, requires
from service.auth import Principal
from service.cases.services import CaseServices


def _cases(request: Request) -> CaseServices:
    cases: CaseServices = request.app.state.cases
    return cases


Cases = Annotated[CaseServices, Depends(_cases)]

Reader = Annotated[Principal, Depends(requires("cases:read"))]
Starter = Annotated[Principal, Depends(requires("cases:start"))]
Canceller = Annotated[Principal, Depends(requires("cases:cancel"))]
Administrator = Annotated[Principal, Depends(requires("admin"))]
AnyKey = Annotated[Principal, Depends(requires())]
Public = Annotated[Principal, Depends(anyone())]
