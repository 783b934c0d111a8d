"""The FastAPI application: the case services opened for its lifetime, the routers,
and every refusal answered as a problem (docs/design.md, "The parts").

``POST /cases`` is a promise: the answer ``202`` comes only after the case row is
committed *and* the broker has confirmed the start command; if either cannot be done
the answer is ``503`` and nothing is left behind (service/cases/start.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import APIRouter, Depends, FastAPI

from casetrail.adapters.bus.watch import EventWatch
from casetrail.adapters.store import ApiKeyStore, KeyRegistry
from casetrail.api import problems
from casetrail.api.apidocs import api_docs_routes
from casetrail.api.deps import known_query_only
from casetrail.api.ledger import ledger_routes
from casetrail.api.log_watch import LogWatch
from casetrail.api.middleware import BodyLimit, Observed
from casetrail.api.oidc import OidcVerifier
from casetrail.api.openapi import exact_openapi
from casetrail.api.routes import a2a, backtests, cases, meta, retention, reviews, streams
from casetrail.api.routes.cases import OrjsonResponse
from casetrail.api.security import Caller, anyone, requires
from casetrail.api.streams import StreamSlots
from casetrail.api.viewer import viewer_routes
from casetrail.cases import case_services
from casetrail.cases.reading import owned
from casetrail.config import Settings
from casetrail.contract.auth import Scope
from casetrail.ledger.note import Verifier
from casetrail.ops.asyncapi import asyncapi_document
from casetrail.trail.admission import Admission, KeyRing


def create_app(settings: Settings) -> FastAPI:
    caller = Caller(oidc=OidcVerifier.from_settings(settings))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with case_services(settings) as opened:
            caller.keys = ApiKeyStore(opened.pool)
            watch = EventWatch(opened.connection, opened.topology, Admission(
                settings.broker_user("worker"), KeyRing(KeyRegistry(opened.pool))))
            await watch.open()
            log_watch = LogWatch(opened.ledger)
            await log_watch.open(opened.connection, opened.topology)
            app.state.cases, app.state.watch, app.state.log = opened, watch, log_watch
            try:
                yield
            finally:
                await log_watch.close()
                await watch.close()

    app = FastAPI(title="casetrail", version="0.1.0", lifespan=lifespan,
                  description="Start tool-using LLM agent cases and read their reasoning trail.",
                  docs_url=None, redoc_url=None)  # /docs is served from the package (apidocs.py)
    app.state.settings, app.state.caller = settings, caller
    app.state.slots = StreamSlots(settings.stream_max_per_key, settings.stream_max_per_tenant)
    app.state.asyncapi = asyncapi_document(settings.namespace, settings.amqp_vhost())
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    app.add_middleware(Observed)  # outermost: it sees every answer, 413s included
    problems.install(app)
    for router in (cases.router, reviews.router, retention.router, backtests.router,
                   streams.router, meta.router, a2a.router):
        app.include_router(router)
    public = Depends(anyone())
    viewer_routes(app, public)
    api_docs_routes(app, public)
    log = APIRouter(dependencies=[Depends(known_query_only)])
    ledger_routes(log, lambda: app.state.cases.ledger, lambda: app.state.log.state,
                  [Verifier.parse(k) for k in settings.ledger_witnesses], public,
                  Depends(requires(Scope.READ)),
                  lambda case_id, principal: owned(app.state.cases, principal, case_id),
                  problems.responses, OrjsonResponse)
    app.include_router(log)
    app.openapi = lambda: exact_openapi(app, settings)  # type: ignore[method-assign]
    return app
