"""The event streams (Server-Sent Events): one case's trail, stored then live, and a
tenant's events live. Each holds a slot of its credential's and its tenant's limit,
and ends when its credential stops working."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import APIRouter, Depends, Header, HTTPException, Request

from casetrail.api.deps import Cases, Reader, known_query_only
from casetrail.api.problems import RETRY_LATER, responses
from casetrail.api.schemas import Health
from casetrail.api.security import Caller
from casetrail.api.streams import (
    EventStream,
    StreamSlots,
    StreamStart,
    StreamTicket,
    TooManyStreams,
    case_stream,
    event_stream,
    parse_event_id,
    tenant_stream,
)
from casetrail.cases.reading import owned, sensitive_values
from casetrail.config import Settings
from casetrail.contract.auth import AuthError
from casetrail.contract.events import ENDED_STATUSES

router = APIRouter(dependencies=[Depends(known_query_only)])


def still_valid(request: Request) -> Callable[[], Awaitable[bool]]:
    """Whether the credential a stream was opened with still works (a revoked or
    expired key ends its streams within the recheck interval)."""
    token = request.headers.get("authorization", "").partition(" ")[2].strip()
    caller: Caller = request.app.state.caller

    async def check() -> bool:
        try:
            return await caller.principal(token) is not None
        except AuthError:
            return False
    return check


async def _ticket(request: Request, principal: Reader) -> StreamTicket:
    """A slot for one more stream of this credential and tenant, or 429 (async: taken
    on the event loop, never from a thread beside another request's)."""
    slots: StreamSlots = request.app.state.slots
    try:
        return slots.take(principal.subject, principal.tenant)
    except TooManyStreams as exc:
        raise HTTPException(429, str(exc), headers=RETRY_LATER) from None


async def _start(
    case_id: uuid.UUID, principal: Reader, services: Cases,
    last_event_id: Annotated[str, Header(pattern=r"^[1-9][0-9]{0,8}\.[0-9]{1,9}$", description=(
        "Resume after this event (`<attempt>.<seq>`, the id the stream sent)."))] = "",
) -> StreamStart:
    """What a case stream needs, checked before the stream's 200 goes out."""
    try:
        after = parse_event_id(last_event_id) if last_event_id else None
    except ValueError as exc:
        raise HTTPException(422, [{"loc": ["header", "last-event-id"], "msg": str(exc),
                                   "type": "value_error"}]) from None
    row = await owned(services, principal, case_id)
    values, _ = await sensitive_values(services, principal, row)
    return StreamStart(case_id, after, row["status"] in ENDED_STATUSES, values)


Ticket = Annotated[StreamTicket, Depends(_ticket)]
_streaming = responses(200, Health, "", 401, 403, 404, 410, 422, 429, 503)
del _streaming[200]  # the event stream itself is described by FastAPI


@router.get("/cases/{case_id}/stream", response_class=EventStream, status_code=200,
            summary="The case's events as Server-Sent Events: stored, then live",
            responses=_streaming)
async def stream_case(request: Request, start: Annotated[StreamStart, Depends(_start)],
                      ticket: Ticket, services: Cases, _: Reader) -> EventStream:
    """Each event as `id: <attempt>.<seq>`, `event: <EVENT_TYPE>`, `data: <envelope>`;
    the stored trail first, then live events, honouring `Last-Event-ID`; ends after the
    terminal event, or when the credential stops working (checked at least every 15 s).
    A credential or tenant with its limit of streams open gets 429."""
    settings: Settings = request.app.state.settings
    return event_stream(ticket, case_stream(
        request.app.state.watch, services.store, start.case_id, start.after, start.ended,
        start.values, settings.stream_ping_seconds, still_valid(request)))


@router.get("/events/stream", response_class=EventStream, status_code=200,
            summary="Every event of the caller's tenant, live, as Server-Sent Events",
            responses={k: v for k, v in _streaming.items() if k not in (404, 410)})
async def stream_tenant(request: Request, principal: Reader, ticket: Ticket,
                        ) -> EventStream:
    """For dashboards: each event as it is published (`id` is the event id); no replay
    (the case streams and `GET /cases` have the record); sensitive values stay
    placeholders. Ends when the credential stops working; 429 beyond the limit of open
    streams."""
    settings: Settings = request.app.state.settings
    return event_stream(ticket, tenant_stream(request.app.state.watch, principal.tenant,
                                              settings.stream_ping_seconds,
                                              still_valid(request)))
