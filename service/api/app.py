"""The FastAPI application: its services and its routes.

``POST /cases`` is a promise: the answer ``202`` comes only after the case row
is committed *and* the broker has confirmed the start command; if either
cannot be done the answer is ``503`` and nothing is left behind.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

import orjson
from fastapi import Body, FastAPI, Header, HTTPException, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from service.agents import AGENTS
from service.api.middleware import BodyLimit
from service.api.schemas import CancelRequest, CaseRequest, LimitsRequest
from service.bus import fastpath
from service.bus.connection import connect_patiently
from service.bus.publisher import EventPublisher, Publisher
from service.bus.topology import Topology
from service.commands import CancelCommand, CaseStartCommand
from service.config import Settings
from service.errors import BusUnavailable, CasetrailError, PublishRejected, StoreUnavailable
from service.events import EVENT_TYPES, Limits, ModelRef, cancelled_while_queued
from service.providers import base_url_problem
from service.store import CaseStore, NewCase, pool_patiently

log = logging.getLogger("casetrail.api")


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
    def stamp(value: Any) -> str | None:
        return None if value is None else value.isoformat().replace("+00:00", "Z")

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
        "createdAt": stamp(row["created_at"]),
        "startedAt": stamp(row["started_at"]),
        "endedAt": stamp(row["ended_at"]),
    }


class Services:
    """What the routes need, opened in the app's lifespan."""

    store: CaseStore
    publisher: Publisher
    topology: Topology

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.topology = Topology(settings.namespace)

    async def open(self) -> None:
        fastpath.enable(self.settings.amqp_fastpath)
        self.pool = await pool_patiently(self.settings.database_url, 20)
        self.connection = await connect_patiently(self.settings.amqp_url, "casetrail-api")
        self.store = CaseStore(self.pool)
        channel = await self.connection.channel()
        await self.topology.declare(channel)
        await channel.close()
        # A short retry: a client waiting on POST /cases is better served by a
        # prompt 503 than by a minute of silence.
        self.publisher = await Publisher.open(self.connection, retry_seconds=3.0)

    async def close(self) -> None:
        await self.connection.close()
        await self.pool.close()


def create_app(settings: Settings) -> FastAPI:  # noqa: PLR0915 - the routes, in one place
    services = Services(settings)

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
    )
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)

    @app.exception_handler(StoreUnavailable)
    async def store_down(request: Request, exc: StoreUnavailable) -> JSONResponse:
        return JSONResponse({"detail": "database unavailable, try again"}, status_code=503)

    @app.exception_handler(BusUnavailable)
    async def bus_down(request: Request, exc: BusUnavailable) -> JSONResponse:
        return JSONResponse({"detail": "message broker unavailable, try again"}, status_code=503)

    @app.post("/cases", status_code=202, summary="Start a case", responses={
        202: {"description": "Accepted: the case is recorded and its start command confirmed",
              "content": {"application/json": {"example": {
                  "caseId": "6c1f…", "status": "queued", "agent": "loan-officer"}}}},
        409: {"description": "Idempotency-Key reused with another body"},
        413: {"description": "Body too large"},
        422: {"description": "Unknown agent, invalid input, limits beyond the caps"},
        503: {"description": "Broker or database unavailable; nothing was kept"},
    })
    async def start_case(
        request: Annotated[CaseRequest, Body()],
        idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
    ) -> Response:
        """Validate, record the case as ``queued``, publish its start command with a
        confirm, then answer 202. A repeated ``Idempotency-Key`` returns the first case."""
        agent = AGENTS.get(request.agent)
        if agent is None:
            raise _unprocessable([(["agent"], f"unknown agent {request.agent!r}; the agents are: "
                                             + ", ".join(sorted(AGENTS)))])
        try:
            validated = agent.input_model.model_validate(request.input)
        except ValidationError as exc:
            raise _unprocessable([
                (["input", *e["loc"]], e["msg"]) for e in exc.errors(include_url=False)
            ]) from None
        limits = _limits(request.limits, agent.default_limits, settings)
        model = request.model or agent.default_model
        if problem := base_url_problem(model, settings):
            raise _unprocessable([(["model", "baseUrl"], problem)])
        case_input = validated.model_dump(mode="json", by_alias=True)
        digest = hashlib.sha256(orjson.dumps(
            {"agent": agent.name, "input": case_input, "limits": limits.model_dump(),
             "model": model.model_dump()}, option=orjson.OPT_SORT_KEYS,
        )).hexdigest()
        new = NewCase(
            case_id=uuid.uuid4(), agent=agent.name, input=case_input,
            model=model.model_dump(mode="json", by_alias=True, exclude_none=True),
            limits=limits.model_dump(mode="json", by_alias=True),
            request_digest=digest, idempotency_key=idempotency_key,
        )
        row, created = await services.store.insert_case(new)
        headers = {"Location": f"/cases/{row['case_id']}"}
        if not created:
            if row["request_digest"] != digest:
                raise HTTPException(409, "Idempotency-Key was already used with another request")
            headers["Idempotency-Replayed"] = "true"
            if row["attempts_claimed"] == 0 and row["status"] == "queued":
                # The first request may have died before its start command was
                # confirmed; another copy is harmless (the claim runs it once).
                await _publish_start(services, row["case_id"], agent.name, case_input, model,
                                     limits, forget_on_failure=False)
        else:
            await _publish_start(services, new.case_id, agent.name, case_input, model, limits,
                                 forget_on_failure=True)
        case_id = str(row["case_id"])
        return OrjsonResponse({
            "caseId": case_id, "status": row["status"], "agent": agent.name,
            "limits": row["limits"], "model": row["model"],
            "links": {"self": f"/cases/{case_id}", "events": f"/cases/{case_id}/events"},
        }, status_code=202, headers=headers)

    @app.get("/cases/{case_id}", summary="A case's status, totals and answer")
    async def get_case(case_id: uuid.UUID) -> Response:
        row = await services.store.get_case(case_id)
        if row is None:
            raise HTTPException(404, f"no case {case_id}")
        return OrjsonResponse(_case_view(row))

    @app.get("/cases/{case_id}/events", summary="The case's trail, in order")
    async def get_events(
        case_id: uuid.UUID,
        types: Annotated[str | None, Query(
            description="Comma-separated event types, e.g. REACT_CYCLE,CASE_COMPLETED"
        )] = None,
    ) -> Response:
        wanted = [t.strip() for t in types.split(",") if t.strip()] if types else []
        unknown = [t for t in wanted if t not in EVENT_TYPES]
        if unknown:
            raise HTTPException(422, [{
                "loc": ["query", "types"], "type": "value_error",
                "msg": f"unknown event types {unknown}; known: {', '.join(EVENT_TYPES)}",
            }])
        events = await services.store.find_by_case_and_types(case_id, wanted or None)
        if not events and await services.store.get_case(case_id) is None:
            raise HTTPException(404, f"no case {case_id}")
        return OrjsonResponse({"caseId": str(case_id), "events": [e.as_json() for e in events]})

    @app.post("/cases/{case_id}/cancel", status_code=202, summary="Ask a case to stop")
    async def cancel_case(
        case_id: uuid.UUID, request: Annotated[CancelRequest | None, Body()] = None
    ) -> dict[str, Any]:
        reason = request.reason if request else None
        outcome = await services.store.request_cancel(case_id, reason)
        if outcome == "unknown":
            raise HTTPException(404, f"no case {case_id}")
        if outcome == "ended":
            raise HTTPException(409, f"case {case_id} has already ended")
        owner = f"api:{uuid.uuid4().hex[:6]}"
        if await services.store.take_queued_for_cancel(case_id, owner, settings.lease_seconds):
            sink = EventPublisher(services.publisher, services.topology)
            for event in cancelled_while_queued(case_id, reason):
                await sink.emit(event)
            await services.store.mark_terminal_published(case_id)
            return {"caseId": str(case_id), "status": "cancelled"}
        await services.publisher.publish(
            services.topology.cancel_exchange, "",
            CancelCommand(case_id=case_id, reason=reason).to_json(),
            message_type="CANCEL", correlation_id=str(case_id),
        )
        return {"caseId": str(case_id), "status": "cancelling"}

    @app.get("/agents", summary="The agent profiles")
    async def agents() -> dict[str, Any]:
        return {"agents": [agent.describe() for agent in AGENTS.values()]}

    @app.get("/healthz", summary="The process is alive")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", summary="Broker and database are reachable")
    async def readyz(response: Response) -> dict[str, Any]:
        checks: dict[str, str] = {}
        try:
            await services.store.ping()
            checks["database"] = "ok"
        except CasetrailError as exc:
            checks["database"] = str(exc)
        checks["broker"] = "ok" if not services.connection.is_closed and \
            not services.publisher.channel.is_closed else "disconnected"
        ready = all(v == "ok" for v in checks.values())
        response.status_code = 200 if ready else 503
        return {"ready": ready, "checks": checks}

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


async def _publish_start(
    services: Services,
    case_id: uuid.UUID,
    agent: str,
    case_input: dict[str, Any],
    model: ModelRef,
    limits: Limits,
    *,
    forget_on_failure: bool,
) -> None:
    command = CaseStartCommand(case_id=case_id, agent=agent, input=case_input, model=model,
                               limits=limits)
    try:
        await services.publisher.publish(
            services.topology.commands_exchange, Topology.START_KEY, command.to_json(),
            message_id=str(case_id), message_type="CASE_START", correlation_id=str(case_id),
        )
    except (BusUnavailable, PublishRejected) as exc:
        log.error("start command for %s not accepted: %s", case_id, exc)
        if forget_on_failure:
            await services.store.delete_unstarted(case_id)
        raise HTTPException(503, "message broker did not accept the case; nothing was kept") \
            from exc
