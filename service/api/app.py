"""The FastAPI application: its services and its routes.

``POST /cases`` is a promise: the answer ``202`` comes only after the case row
is committed *and* the broker has confirmed the start command; if either
cannot be done the answer is ``503`` and nothing is left behind.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Any

import orjson
from fastapi import Body, Depends, FastAPI, Header, HTTPException, Query, Request, Response
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from fastapi.sse import EventSourceResponse, ServerSentEvent
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.admission import Admission, KeyRing
from service.agents import AGENTS
from service.api.apidocs import api_docs_routes
from service.api.ledger import ledger_routes
from service.api.middleware import BodyLimit, Observed
from service.api.oidc import OidcVerifier
from service.api.openapi import exact_openapi
from service.api.schemas import (
    AgentList,
    AsyncApiDocument,
    Bundle,
    CancelAccepted,
    CancelRequest,
    CaseAccepted,
    CaseList,
    CaseRequest,
    CaseView,
    EraseAccepted,
    Health,
    Identity,
    LimitsRequest,
    Problem,
    Readiness,
    SigningKeys,
    Trail,
    ValidationProblem,
    VerifyReport,
)
from service.api.security import Caller
from service.api.streams import (
    StreamSlots,
    StreamStart,
    StreamTicket,
    TooManyStreams,
    case_stream,
    parse_event_id,
    tenant_stream,
)
from service.api.viewer import viewer_routes
from service.asyncapi import asyncapi_document
from service.auth import Principal
from service.batching import Coalescer
from service.bus import fastpath
from service.bus.connection import connect_patiently
from service.bus.publisher import Publisher
from service.bus.start_commands import send_start
from service.bus.topology import Topology
from service.bus.watch import EventWatch
from service.commands import CancelCommand
from service.config import Settings
from service.erasure import erase
from service.errors import (
    BusUnavailable,
    CasetrailError,
    PermanentError,
    PublishRejected,
    StoreUnavailable,
)
from service.events import ENDED_STATUSES, EVENT_TYPES, CaseStatus, Limits
from service.evidence import Evidence
from service.ledger.note import Verifier
from service.ledger.store import LedgerStore
from service.providers import model_problem
from service.search import CURSOR_PATTERN, CaseFilter, CaseIndex, Cursor
from service.sensitive import Vault, restore, split
from service.store import (
    ApiKeyStore,
    CaseSecrets,
    CaseStore,
    KeyRegistry,
    NewCase,
    component_pool,
    rate_wait,
    tenant_counts,
    utc_text,
)
from service.telemetry import metrics

log = logging.getLogger("casetrail.api")

RETRY_LATER = {"Retry-After": "5"}
START_PUBLISHING_SECONDS = 30.0
"""How long one request holds the right to publish a case's start command (the column
default of ``start_publishing_until`` for a new case, migration 011)."""
"""On a 503: the broker or the database is away or full; nothing was kept."""

_ERRORS: dict[int, tuple[type, str]] = {
    400: (Problem, "The body is not readable JSON"),
    401: (Problem, "No valid API key: a WWW-Authenticate: Bearer challenge"),
    403: (Problem, "The API key lacks a scope this route needs (named)"),
    404: (Problem, "No such case"),
    409: (Problem, "Conflicts with the case's state or an earlier request"),
    429: (Problem, "The tenant's quota is used up; Retry-After says when to try again"),
    413: (Problem, "The body is larger than CASETRAIL_MAX_BODY_BYTES"),
    422: (ValidationProblem, "A field is invalid: each one with the reason"),
    503: (Problem, "Broker or database unavailable; nothing was kept"),
}


def _offered(settings: Settings) -> list[str]:
    """The agents a case may name here (bench-only ones in bench mode only)."""
    return [name for name, agent in AGENTS.items() if settings.bench_mode or not agent.bench_only]


def _unstorable_text(value: Any, loc: list[str | int]) -> list[str | int] | None:
    """Where ``value`` holds text Postgres cannot store (a NUL character) or UTF-8
    cannot encode (a lone surrogate), or ``None``."""
    if isinstance(value, str):
        if "\x00" in value:
            return loc
        try:
            value.encode()
        except UnicodeEncodeError:
            return loc
        return None
    items = value.items() if isinstance(value, dict) else \
        enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        if (found := _unstorable_text(key, loc) if isinstance(key, str) else None) is not None:
            return found
        if (found := _unstorable_text(item, [*loc, key])) is not None:
            return found
    return None


def _refuse_unstorable_text(body: Any, root: str) -> None:
    if (loc := _unstorable_text(body, [root] if root else [])) is not None:
        raise _unprocessable([(loc, "text may not contain NUL characters or lone surrogates")])


INSTANT = (r"^([0-9]{3}[1-9]|[0-9]{2}[1-9]0|[0-9][1-9]00|[1-9]000)"
           r"-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])[Tt]([01][0-9]|2[0-3])"
           r":[0-5][0-9]:[0-5][0-9](\.[0-9]{1,9})?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$")
"""An RFC 3339 date-time: the offset is required (a bare local time is ambiguous)."""


def _instant(text: str | None, name: str) -> datetime | None:
    if text is None:
        return None
    try:
        # Python's parser takes six fractional digits at most; RFC 3339 allows more.
        head, dot, rest = text.partition(".")
        if dot:
            digits = len(rest) - len(rest.lstrip("0123456789"))
            text = f"{head}.{rest[:min(digits, 6)]}{rest[digits:]}"
        return datetime.fromisoformat(text.upper())
    except ValueError as exc:
        raise HTTPException(422, [{"loc": ["query", name], "type": "value_error",
                                   "msg": f"not an RFC 3339 date-time: {exc}"}]) from None


def _refuse_unstorable_query(**values: str | None) -> None:
    for name, value in values.items():
        if value is not None and _unstorable_text(value, []) is not None:
            raise HTTPException(422, [{"loc": ["query", name], "type": "value_error",
                                       "msg": "text may not contain NUL characters or lone "
                                              "surrogates"}])


def _responses(ok: int, model: type, description: str, *errors: int
               ) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI responses of a route: its success and every error it can return."""
    described: dict[int | str, dict[str, Any]] = {ok: {"model": model,
                                                       "description": description}}
    for code in errors:
        error_model, error_description = _ERRORS[code]
        described[code] = {"model": error_model, "description": error_description}
    return described


def _unprocessable(problems: list[tuple[list[str | int], str]]) -> HTTPException:
    return HTTPException(
        status_code=422,
        detail=[
            {"loc": ["body", *loc], "msg": msg, "type": "value_error"} for loc, msg in problems
        ],
    )


class OrjsonResponse(Response):
    """JSON through orjson, returned directly by the routes so FastAPI's generic
    encoder stays off the hot path."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


def _case_view(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "caseId": str(row["case_id"]),
        "agent": row["agent"],
        "status": row["status"],
        "attempts": row["attempts_claimed"],
        "cycles": row["cycles"],
        "tokenUsage": {"inputTokens": row["input_tokens"], "outputTokens": row["output_tokens"]},
        "answer": row["answer"],
        "outcome": row["outcome"],
        "input": row["input"],
        "model": row["model"],
        "limits": row["limits"],
        "cancelRequested": row["cancel_requested_at"] is not None,
        "createdAt": utc_text(row["created_at"]),
        "startedAt": utc_text(row["started_at"]),
        "endedAt": utc_text(row["ended_at"]),
    }


QUOTA_REFRESH_SECONDS = 0.25
"""How long an API process counts a tenant's starts itself before asking Postgres again."""


@dataclass
class TenantLoad:
    """A tenant's cases as Postgres last counted them, plus this process's admissions."""

    fetched_at: float
    active: int
    recent: int

    def admitted(self) -> None:
        self.active += 1
        self.recent += 1


@dataclass
class TenantLoads:
    """Per-tenant counts behind the quotas, read from Postgres at most every quarter
    second and counted up here between reads: a quota check costs a dictionary lookup,
    not a query. Another API process's starts are seen at the next read, so tenants
    can exceed a limit by what the other processes admit in that quarter second."""

    count: Callable[[str, int, int], Awaitable[tuple[int, int]]]
    _loads: dict[str, TenantLoad] = field(default_factory=dict)

    async def load(self, tenant: str, max_active: int, max_per_minute: int) -> TenantLoad:
        now = time.monotonic()
        load = self._loads.get(tenant)
        if load is None or now - load.fetched_at > QUOTA_REFRESH_SECONDS:
            active, recent = await self.count(tenant, max_active, max_per_minute)
            load = self._loads[tenant] = TenantLoad(now, active, recent)
        return load


class Services:
    """What the routes need, opened in the app's lifespan."""

    store: CaseStore
    index: CaseIndex
    watch: EventWatch
    evidence: Evidence
    ledger: LedgerStore
    publisher: Publisher
    topology: Topology

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.topology = Topology(settings.namespace)
        self.caller = Caller(oidc=OidcVerifier.from_settings(settings))

    async def open(self) -> None:
        fastpath.enable(self.settings.amqp_fastpath)
        identity = self.settings.identity("api")
        self.pool = await component_pool(identity, 20)
        self.connection = await connect_patiently(identity.amqp_url, "casetrail-api")
        self.store = CaseStore(self.pool)
        self.index = CaseIndex(self.pool)
        self.secrets = CaseSecrets(self.pool, Vault.from_text(self.settings.master_key_text()))
        self.ledger = LedgerStore(self.pool)
        self.evidence = Evidence(self.store, KeyRegistry(self.pool), self.ledger)
        self.caller.keys = ApiKeyStore(self.pool)
        self.quotas = TenantLoads(lambda *args: tenant_counts(self.pool, *args))
        self.confirmed_starts = Coalescer(self.store.mark_starts_confirmed)
        self.noting: set[asyncio.Task[None]] = set()
        channel = await self.connection.channel()
        await self.topology.require(channel)
        await channel.close()
        # A short retry, and a nack (a full start queue, a queue between leaders)
        # answered at once: a client waiting on POST /cases is better served by a
        # prompt 503 than by a minute of silence.
        self.publisher = await Publisher.open(self.connection, retry_seconds=3.0,
                                              retry_nacks=False)
        self.watch = EventWatch(self.connection, self.topology, Admission(
            self.settings.broker_user("worker"), KeyRing(KeyRegistry(self.pool))))
        await self.watch.open()

    def note_start_confirmed(self, case_id: uuid.UUID) -> None:
        """Record, off the request's path, that the broker confirmed a start command (a
        note lost is harmless: a re-sent request may then publish one more copy)."""
        async def note() -> None:
            try:
                await self.confirmed_starts(case_id)
            except CasetrailError as exc:
                log.warning("could not note the start of %s as confirmed: %s", case_id, exc)

        task = asyncio.create_task(note())
        self.noting.add(task)
        task.add_done_callback(self.noting.discard)

    async def close(self) -> None:
        if self.noting:
            await asyncio.wait(self.noting, timeout=5)
        await self.watch.close()
        await self.connection.close()
        await self.pool.close()


def create_app(settings: Settings) -> FastAPI:  # noqa: PLR0915 - the routes, in one place
    services = Services(settings)
    caller = services.caller
    # Dependencies as defaults, not in Annotated[...]: annotations are strings here
    # (from __future__), evaluated where `caller` is not in scope.
    reader = Depends(caller.requires("cases:read"))
    starter = Depends(caller.requires("cases:start"))
    canceller = Depends(caller.requires("cases:cancel"))
    administrator = Depends(caller.requires("admin"))
    any_key = Depends(caller.requires())
    public = Depends(caller.anyone())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await services.open()
        yield
        await services.close()

    app = FastAPI(
        title="casetrail",
        version="0.1.0",
        description="Start tool-using LLM agent cases and read their reasoning trail.",
        lifespan=lifespan,
        docs_url=None, redoc_url=None,  # /docs is served from the package (apidocs.py)
    )
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    app.add_middleware(Observed)  # outermost: it sees every answer, 413s included

    async def owned_case(case_id: uuid.UUID, principal: Principal) -> dict[str, Any]:
        """The case, if it belongs to the caller's tenant: another tenant's case is a
        404, never a 403, so its existence is not confirmed."""
        row = await services.store.get_case(case_id)
        if row is None or row["tenant_id"] != principal.tenant:
            raise HTTPException(404, f"no case {case_id}")
        return row

    async def sensitive_view(case_id: uuid.UUID, principal: Principal
                             ) -> tuple[dict[str, str], dict[str, Any] | None]:
        """The values to show in clear (only with ``pii:read``; the read is logged) and
        the summary of the case's sensitive input."""
        state = await services.secrets.state(case_id)
        if state is None:
            return {}, None
        values: dict[str, str] = {}
        if principal.allows("pii:read") and state.sealed is not None:
            try:
                values = services.secrets.vault.open(case_id, state.sealed)
            except PermanentError as exc:  # sealed under another master key
                log.error("case %s: sensitive values not opened: %s", case_id, exc)
            else:
                await services.secrets.log_access(principal.subject, principal.tenant,
                                                  case_id, "pii:read")
        return values, {
            "placeholders": list(state.placeholders), "shownInClear": bool(values),
            "erasedAt": None if state.erased_at is None
            else state.erased_at.isoformat().replace("+00:00", "Z"),
            "erasedBy": state.erased_by}

    @app.exception_handler(StarletteHTTPException)
    async def http_problem(request: Request, exc: StarletteHTTPException) -> Response:
        """FastAPI's own answer, except that a 405's ``Allow`` names every method the
        path has (Starlette names only those of the first route it matched)."""
        if exc.status_code == 405:
            methods = {m for route in app.routes if isinstance(route, APIRoute)
                       and route.path_regex.match(request.url.path) for m in route.methods or ()}
            exc.headers = {**(exc.headers or {}), "Allow": ", ".join(sorted(methods))}
        return await http_exception_handler(request, exc)

    @app.exception_handler(StoreUnavailable)
    async def store_down(request: Request, exc: StoreUnavailable) -> JSONResponse:
        return JSONResponse({"detail": "database unavailable, try again"}, status_code=503,
                            headers=RETRY_LATER)

    @app.exception_handler(BusUnavailable)
    async def bus_down(request: Request, exc: BusUnavailable) -> JSONResponse:
        return JSONResponse({"detail": "message broker unavailable, try again"},
                            status_code=503, headers=RETRY_LATER)

    @app.post("/cases", status_code=202, summary="Start a case", response_model=None,
              responses=_responses(
                  202, CaseAccepted,
                  "Accepted: the case is recorded and its start command confirmed",
                  400, 401, 403, 409, 413, 422, 429, 503))
    async def start_case(
        request: Annotated[CaseRequest, Body()],
        principal: Principal = starter,
        idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
    ) -> Response:
        """Validate, record the case as ``queued``, publish its start command with a
        confirm, then answer 202. A repeated ``Idempotency-Key`` returns the first case."""
        if request.model is not None and not principal.allows("models:override"):
            raise HTTPException(403, "this API key lacks the scope 'models:override' "
                                     "(needed to send model)")
        agent = AGENTS.get(request.agent)
        if agent is not None and agent.bench_only and not settings.bench_mode:
            raise _unprocessable([(["agent"], f"agent {agent.name!r} is for benchmarks and "
                                             "tests only (CASETRAIL_BENCH_MODE=1)")])
        if agent is None:
            raise _unprocessable([(["agent"], f"unknown agent {request.agent!r}; the agents are: "
                                             + ", ".join(sorted(_offered(settings))))])
        try:
            validated = agent.input_model.model_validate(request.input)
        except ValidationError as exc:
            raise _unprocessable([
                (["input", *e["loc"]], e["msg"]) for e in exc.errors(include_url=False)
            ]) from None
        _refuse_unstorable_text(request.model_dump(mode="python", by_alias=True), "")
        limits = _limits(request.limits, agent.default_limits, settings)
        model = request.model or agent.default_model
        if problem := model_problem(model, settings):
            raise _unprocessable([(["model", problem[0]], problem[1])])
        if request.model is not None and request.model.latency_ms is not None \
                and not settings.bench_mode:
            raise _unprocessable([(["model", "latencyMs"], "latencyMs is for benchmarks and "
                                   "tests only (CASETRAIL_BENCH_MODE=1)")])
        case_input = validated.model_dump(mode="json", by_alias=True)
        stored_input, values = split(agent.input_model, case_input)
        case_id = uuid.uuid4()
        # Keyed: the digest of a request that held a sensitive value must not let
        # anyone who reads `cases` test guesses of that value (after an erasure too).
        digest = services.secrets.vault.request_digest(orjson.dumps(
            {"agent": agent.name, "input": case_input, "limits": limits.model_dump(),
             "model": model.model_dump()}, option=orjson.OPT_SORT_KEYS))
        new = NewCase(
            case_id=case_id, agent=agent.name, input=stored_input,
            sealed=services.secrets.vault.seal(case_id, values) if values else None,
            placeholders=tuple(values),
            model=model.model_dump(mode="json", by_alias=True, exclude_none=True),
            limits=limits.model_dump(mode="json", by_alias=True),
            request_digest=digest, idempotency_key=idempotency_key,
            tenant_id=principal.tenant, started_by=principal.subject,
        )
        if idempotency_key is None or not await services.store.idempotency_key_used(
                principal.tenant, idempotency_key):
            await _within_quota(services, principal.tenant)
        row, created = await services.store.insert_case(new)
        headers = {"Location": f"/cases/{row['case_id']}"}
        if not created:
            if row["request_digest"] != digest:
                raise HTTPException(409, "Idempotency-Key was already used with another request")
            headers["Idempotency-Replayed"] = "true"
            if row["start_confirmed_at"] is None and row["attempts_claimed"] == 0 \
                    and row["status"] == CaseStatus.QUEUED:
                # The first request may have died before its start command was
                # confirmed: publish one more copy (the claim runs it once), but only
                # one, however many re-sends arrive (the lease), and within the
                # tenant's rate, so re-sends cannot flood the start queue.
                await _within_rate(services, principal.tenant)
                if await services.store.take_start_resend(row["case_id"],
                                                          START_PUBLISHING_SECONDS):
                    await _publish_start(services, row, forget_on_failure=False)
        else:
            await _publish_start(services, row, forget_on_failure=True)
            metrics.CASES_ACCEPTED.labels(agent.name).inc()
        shown = str(row["case_id"])
        return OrjsonResponse({
            "caseId": shown, "status": row["status"], "agent": agent.name,
            "limits": row["limits"], "model": row["model"],
            "links": {"self": f"/cases/{shown}", "events": f"/cases/{shown}/events"},
        }, status_code=202, headers=headers)

    @app.get("/cases/{case_id}", summary="A case's status, totals and answer",
             response_model=None,
             responses=_responses(200, CaseView, "The case", 401, 403, 404, 422, 503))
    async def get_case(case_id: uuid.UUID,
                       principal: Principal = reader) -> Response:
        row = await owned_case(case_id, principal)
        view = _case_view(row)
        view["integrity"] = await services.evidence.integrity_summary(case_id, row)
        values, view["sensitive"] = await sensitive_view(case_id, principal)
        return OrjsonResponse(restore(view, values))

    @app.get("/cases/{case_id}/verify", summary="Whether the case's trail is intact",
             response_model=None,
             responses=_responses(200, VerifyReport,
                                  "Every chain, signature and the completeness, checked",
                                  401, 403, 404, 422, 503))
    async def verify_case(case_id: uuid.UUID,
                          principal: Principal = reader) -> Response:
        report = await services.evidence.verify(case_id, await owned_case(case_id, principal))
        assert report is not None
        return OrjsonResponse(report.as_json())

    @app.get("/cases/{case_id}/bundle", summary="The case as an offline bundle",
             response_model=None,
             responses=_responses(200, Bundle,
                                  "The events exactly as signed and the public keys "
                                  "(check it with `casetrail verify-bundle`)",
                                  401, 403, 404, 422, 503))
    async def bundle_case(case_id: uuid.UUID,
                          principal: Principal = reader) -> Response:
        bundle = await services.evidence.bundle(case_id, await owned_case(case_id, principal))
        assert bundle is not None
        await services.secrets.log_access(principal.subject, principal.tenant, case_id,
                                          "export")
        return OrjsonResponse(bundle, headers={
            "Content-Disposition": f'attachment; filename="casetrail-{case_id}.json"'})

    @app.get("/signing-keys", summary="The public keys events are signed with",
             response_model=None,
             responses=_responses(200, SigningKeys, "Every registered key, retired ones too",
                                  503))
    async def signing_keys(
        _: Principal = public,
    ) -> Response:
        return OrjsonResponse({"keys": await services.evidence.keys.describe()})

    @app.get("/cases/{case_id}/events", summary="The case's trail, in order",
             response_model=None,
             responses=_responses(200, Trail, "The trail in (attempt, seq) order",
                                  401, 403, 404, 422, 503))
    async def get_events(case_id: uuid.UUID, request: Request,
                         principal: Principal = reader) -> Response:
        # ``types`` is a comma-separated list (``?types=REACT_CYCLE,CASE_COMPLETED``),
        # read here and described in the OpenAPI document as an array of the event
        # types, style form, not exploded (service/api/openapi.py).
        types = request.query_params.get("types")
        wanted = types.split(",") if types else []
        unknown = [t for t in wanted if t not in EVENT_TYPES]
        if unknown:
            raise HTTPException(422, [{
                "loc": ["query", "types"], "type": "value_error",
                "msg": f"unknown event types {unknown}; known: {', '.join(EVENT_TYPES)}",
            }])
        await owned_case(case_id, principal)
        events = await services.store.find_by_case_and_types(case_id, wanted or None)
        values, _ = await sensitive_view(case_id, principal)
        return OrjsonResponse({"caseId": str(case_id),
                               "events": [restore(e.as_json(), values) for e in events]})

    @app.get("/cases", summary="Search the tenant's cases, newest first", response_model=None,
             responses=_responses(200, CaseList, "A page of cases and the next page's cursor",
                                  401, 403, 422, 503))
    async def search_cases(
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
        principal: Principal = reader,
    ) -> Response:
        _refuse_unstorable_query(agent=agent, decision=decision)
        after = Cursor.decode(cursor) if cursor is not None else None  # pattern-checked
        wanted = CaseFilter(principal.tenant, agent, status, decision,
                            _instant(since, "since"), _instant(until, "until"))
        items, following = await services.index.search(wanted, limit, after)
        return OrjsonResponse({"items": items,
                               "nextCursor": following.encode() if following else None})

    def still_valid(request: Request) -> Callable[[], Awaitable[bool]]:
        """Whether the credential a stream was opened with still works (a revoked or
        expired key ends its streams at the next keep-alive)."""
        token = request.headers.get("authorization", "").partition(" ")[2].strip()

        async def check() -> bool:
            return await caller.principal(token) is not None
        return check

    slots = StreamSlots(settings.stream_max_per_key, settings.stream_max_per_tenant)

    def stream_ticket(principal: Principal = reader) -> StreamTicket:
        """A slot for one more stream of this credential and tenant, or 429."""
        try:
            return slots.take(principal.subject, principal.tenant)
        except TooManyStreams as exc:
            raise HTTPException(429, str(exc), headers=RETRY_LATER) from None

    async def stream_start(
        case_id: uuid.UUID, principal: Principal = reader,
        last_event_id: Annotated[str, Header(pattern=r"^[1-9][0-9]{0,8}\.[0-9]{1,9}$",
                                             description=(
            "Resume after this event (`<attempt>.<seq>`, the id the stream sent)."))] = "",
    ) -> StreamStart:
        """What a case stream needs, checked before the stream's 200 goes out."""
        try:
            after = parse_event_id(last_event_id) if last_event_id else None
        except ValueError as exc:
            raise HTTPException(422, [{"loc": ["header", "last-event-id"], "msg": str(exc),
                                       "type": "value_error"}]) from None
        row = await owned_case(case_id, principal)
        values, _ = await sensitive_view(case_id, principal)
        return StreamStart(case_id, after, row["status"] in ENDED_STATUSES, values)

    streaming = _responses(200, Health, "", 401, 403, 404, 422, 429, 503)
    del streaming[200]  # the event stream itself is described by FastAPI

    @app.get("/cases/{case_id}/stream", response_class=EventSourceResponse,
             summary="The case's events as Server-Sent Events: stored, then live",
             responses=streaming)
    async def stream_case(request: Request, start: StreamStart = Depends(stream_start),
                          ticket: StreamTicket = Depends(stream_ticket),
                          _: Principal = reader) -> AsyncIterator[ServerSentEvent]:
        """Each event as `id: <attempt>.<seq>`, `event: <EVENT_TYPE>`, `data: <envelope>`;
        the stored trail first, then live events, honouring `Last-Event-ID`; ends after
        the terminal event, or when the credential stops working (checked at least every
        15 s). A credential or tenant with its limit of streams open gets 429."""
        # Closed here, in order, when the stream ends or is cancelled (not left to the
        # garbage collector, which would close the inner generator out of order).
        with ticket:  # the stream's slot, given back when it ends
            async with aclosing(case_stream(services.watch, services.store, start.case_id,
                                            start.after, start.ended, start.values,
                                            settings.stream_ping_seconds,
                                            still_valid(request))) as messages:
                async for message in messages:
                    yield message

    @app.get("/events/stream", response_class=EventSourceResponse,
             summary="Every event of the caller's tenant, live, as Server-Sent Events",
             responses={k: v for k, v in streaming.items() if k != 404})
    async def stream_tenant(request: Request, principal: Principal = reader,
                            ticket: StreamTicket = Depends(stream_ticket),
                            ) -> AsyncIterator[ServerSentEvent]:
        """For dashboards: each event as it is published (`id` is the event id); no
        replay (the case streams and `GET /cases` have the record); sensitive values
        stay placeholders. Ends when the credential stops working; 429 beyond the
        limit of open streams."""
        with ticket:
            async with aclosing(tenant_stream(services.watch, principal.tenant,
                                              settings.stream_ping_seconds,
                                              still_valid(request))) as messages:
                async for message in messages:
                    yield message

    @app.post("/cases/{case_id}/cancel", status_code=202, summary="Ask a case to stop",
              response_model=None,
              responses=_responses(202, CancelAccepted, "The case is stopping or stopped",
                                   400, 401, 403, 404, 409, 413, 422, 503))
    async def cancel_case(
        case_id: uuid.UUID,
        principal: Principal = canceller,
        request: Annotated[CancelRequest | None, Body()] = None,
    ) -> dict[str, Any]:
        reason = request.reason if request else None
        _refuse_unstorable_text(reason, "reason")
        await owned_case(case_id, principal)
        outcome = await services.store.request_cancel(case_id, reason, principal.subject)
        if outcome == "unknown":
            raise HTTPException(404, f"no case {case_id}")
        if outcome == "ended":
            raise HTTPException(409, f"case {case_id} has already ended")
        # Only the worker emits case events: a case still queued gets its
        # CASE_CANCELLED from the worker that receives its start command, at once
        # and without running it; a running one stops at its next step.
        await services.publisher.publish(
            services.topology.cancel_exchange, "",
            CancelCommand(case_id=case_id, reason=reason, by=principal.subject).to_json(),
            message_type="CANCEL", correlation_id=str(case_id),
        )
        return {"caseId": str(case_id), "status": "cancelling"}

    @app.post("/cases/{case_id}/erase", status_code=202,
              summary="Erase a case's sensitive values (crypto-shredding)", response_model=None,
              responses=_responses(202, EraseAccepted,
                                   "The values are destroyed; CASE_ERASED follows in the trail",
                                   401, 403, 404, 409, 422, 503))
    async def erase_case(case_id: uuid.UUID, principal: Principal = administrator
                         ) -> Response:
        """Destroy the case's data key and ciphertext. The trail keeps its placeholders
        and every hash still verifies; the worker appends a signed ``CASE_ERASED`` (who,
        when). Only an ended case can be erased."""
        row = await owned_case(case_id, principal)
        done = await erase(services.secrets, services.publisher, services.topology, row,
                           principal.subject)
        if done.outcome == "running":
            raise HTTPException(409, f"case {case_id} is {row['status']}: erase it once it "
                                     "has ended")
        if done.outcome == "nothing":
            raise HTTPException(409, f"case {case_id} holds no sensitive values")
        assert done.erased_at is not None
        return OrjsonResponse({
            "caseId": str(case_id),
            "status": "erased" if done.outcome == "erased" else "already erased",
            "erasedAt": done.erased_at.isoformat().replace("+00:00", "Z")},
            status_code=202)

    @app.get("/agents", summary="The agent profiles", response_model=None,
             responses=_responses(200, AgentList, "Every agent a case may name", 401, 503))
    async def agents(
        _: Principal = any_key,
    ) -> dict[str, Any]:
        return {"agents": [AGENTS[name].describe() for name in _offered(settings)]}

    @app.get("/me", summary="Who the credentials act as", response_model=None,
             responses=_responses(200, Identity, "The tenant, subject and scopes", 401, 503))
    async def me(principal: Principal = any_key) -> dict[str, Any]:
        return {"tenant": principal.tenant, "subject": principal.subject,
                "scopes": sorted(principal.scopes)}

    bus_document = asyncapi_document(settings.namespace, settings.amqp_vhost())

    @app.get("/asyncapi.json", summary="The bus, as an AsyncAPI 3.0 document",
             response_model=None, responses=_responses(200, AsyncApiDocument,
                                                       "Channels, operations, messages"))
    async def asyncapi(_: Principal = public) -> Response:
        return OrjsonResponse(bus_document)

    @app.get("/healthz", summary="The process is alive", response_model=None,
             responses=_responses(200, Health, "Alive"))
    async def healthz(_: Principal = public) -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", summary="Broker and database are reachable", response_model=None,
             responses=_responses(200, Readiness, "Ready") | {
                 503: {"model": Readiness, "description": "Broker or database unreachable"}})
    async def readyz(response: Response,
                     _: Principal = public) -> dict[str, Any]:
        checks: dict[str, str] = {}
        try:
            await services.store.ping()
            checks["database"] = "ok"
        except CasetrailError:
            checks["database"] = "unreachable"  # no internal error text on a public route
        checks["broker"] = "ok" if not services.connection.is_closed and \
            not services.publisher.channel.is_closed else "disconnected"
        ready = all(v == "ok" for v in checks.values())
        response.status_code = 200 if ready else 503
        return {"ready": ready, "checks": checks}

    viewer_routes(app, public)
    api_docs_routes(app, public)
    ledger_routes(app, lambda: services.ledger,
                  [Verifier.parse(k) for k in settings.ledger_witnesses], public, reader,
                  owned_case, _responses, OrjsonResponse)
    app.openapi = lambda: exact_openapi(app, settings)  # type: ignore[method-assign]
    return app


def _limits(requested: LimitsRequest | None, default: Limits, settings: Settings) -> Limits:
    max_cycles = (requested.max_cycles if requested else None) or default.max_cycles
    deadline = (requested.deadline_seconds if requested else None) or default.deadline_seconds
    problems: list[tuple[list[str | int], str]] = []
    if max_cycles > settings.max_cycles_cap:
        problems.append((["limits", "maxCycles"], f"must be at most {settings.max_cycles_cap}"))
    if deadline > settings.max_deadline_seconds:
        problems.append((["limits", "deadlineSeconds"],
                         f"must be at most {settings.max_deadline_seconds:g}"))
    if problems:
        raise _unprocessable(problems)
    return Limits(max_cycles=max_cycles, deadline_seconds=deadline)


async def _within_quota(services: Services, tenant: str) -> None:
    """429 with Retry-After when the tenant has too many cases queued or running, or
    started too many in the last minute (checked before the case is kept)."""
    max_active, max_per_minute = services.settings.quota(tenant)
    load = await services.quotas.load(tenant, max_active, max_per_minute)
    if load.active >= max_active:
        raise HTTPException(429, f"tenant {tenant!r} has {max_active} cases queued or "
                                 "running, its limit; try again when some have ended",
                            headers={"Retry-After": "5"})
    await _within_rate(services, tenant, load)


async def _within_rate(services: Services, tenant: str, load: TenantLoad | None = None
                       ) -> None:
    """429 when the tenant started (or re-sent) its limit of cases in the last minute."""
    max_active, max_per_minute = services.settings.quota(tenant)
    if load is None:
        load = await services.quotas.load(tenant, max_active, max_per_minute)
    if load.recent >= max_per_minute:
        wait = await rate_wait(services.pool, tenant, max_per_minute)
        raise HTTPException(429, f"tenant {tenant!r} started {max_per_minute} cases in the "
                                 "last minute, its limit", headers={"Retry-After": str(wait)})
    load.admitted()


async def _publish_start(services: Services, row: dict[str, Any], *,
                         forget_on_failure: bool) -> None:
    case_id = row["case_id"]
    try:
        await send_start(services.publisher, services.topology, case_id, row["tenant_id"],
                         row["agent"])
        services.note_start_confirmed(case_id)
    except (BusUnavailable, PublishRejected) as exc:
        if forget_on_failure and not await services.store.delete_unstarted(case_id):
            # The broker took the command after all (a node died with its confirm): a
            # worker claimed the case, so it is accepted, not refused.
            log.warning("start command for %s unconfirmed (%s) but the case was claimed",
                        case_id, exc)
            return
        log.error("start command for %s not accepted: %s", case_id, exc)
        # A full start queue (its length limit, reject-publish) lands here too.
        raise HTTPException(503, "message broker did not accept the case; nothing was kept",
                            headers=RETRY_LATER) from exc
