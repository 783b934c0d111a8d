"""A2A's routes (service/api/a2a.py; docs/a2a.md): the agents' cards, public, and each
agent's two bindings, authenticated as REST is: JSON-RPC at ``/a2a/{agent}/`` and
HTTP+JSON under ``/a2a/{agent}`` (``/message:send``, ``/tasks/{id}``, …). The OpenAPI
document names them (tag ``A2A``) with their credentials and errors; their bodies follow
A2A 1.0's own contract (its JSON-RPC methods and protobuf JSON), which the official SDK
checks (tests/integration/test_a2a.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from a2a.server.routes.jsonrpc_dispatcher import JsonRpcDispatcher
from a2a.server.routes.rest_dispatcher import RestDispatcher
from fastapi import APIRouter, Request, Response
from starlette.convertors import Convertor, register_url_convertor

from casetrail.agents import AGENTS
from casetrail.api.a2a import SCOPES, CaseTasks, caller, peek, too_deep_answer
from casetrail.api.a2a_cards import agent_card, card_json
from casetrail.api.a2a_stream import Following
from casetrail.api.deps import AnyKey, Public
from casetrail.api.problems import error_responses
from casetrail.api.routes.cases import OrjsonResponse
from casetrail.api.routes.streams import still_valid
from casetrail.cases import offered
from casetrail.cases.errors import Forbidden, NotFound
from casetrail.contract.auth import Principal, Scope

router = APIRouter(tags=["A2A"])

_A2A_BODY = {"requestBody": {"required": True, "content": {"application/json": {"schema": {
    "type": "object", "description": "An A2A 1.0 request: a JSON-RPC 2.0 envelope at the "
    "agent's base, the method's protobuf JSON on the HTTP+JSON binding "
    "(https://a2a-protocol.org)."}}}}}


_VERSION = {"name": "A2A-Version", "in": "header", "required": True, "description":
            "The A2A protocol version the caller speaks (the SDKs send it).",
            "schema": {"type": "string", "enum": ["1.0"]}}
_TASK_ID = {"name": "id", "in": "path", "required": True, "description": "The task's id, "
            "which is the case's.", "schema": {"type": "string"}}


class _TaskId(Convertor[str]):
    """A task id in a path: no ``/`` and no ``:``, so that ``/tasks/{id}`` never takes
    ``/tasks/{id}:cancel``."""

    regex = "[^/:]+"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("a2a_task", _TaskId())


def _extra(path: str, method: str, *, version_required: bool = True) -> dict[str, Any]:
    """What FastAPI cannot see of an A2A route: the version header (the HTTP+JSON binding
    refuses a request without it; JSON-RPC takes one without), a task id in the path (read
    by the SDK's dispatcher, not by our endpoint) and the request's body."""
    version = _VERSION if version_required else {
        **_VERSION, "required": False, "schema": {"type": "string"}}
    return {"parameters": [version, *([_TASK_ID] if "{id" in path else [])],
            **(_A2A_BODY if method == "POST" else {})}


def _answers(what: str, *errors: int, streams: bool = False) -> dict[int | str, Any]:
    """The OpenAPI responses of an A2A route: A2A's own answers (JSON, or on the
    HTTP+JSON binding ``application/a2a+json``), and REST's refusals; a 404 is either an
    unknown agent (ours) or an unknown task (A2A's)."""
    a2a = {"schema": {"type": "object"}}
    ours = {"application/json": a2a, "application/a2a+json": a2a}
    shown = {**error_responses(*errors)}
    if 404 in shown:
        shown[404] = {"description": "No such agent (a problem), or no such task (A2A's "
                      "TaskNotFound)", "content": {**ours, "application/problem+json": {
                          "schema": {"$ref": "#/components/schemas/Problem"}}}}
    return {200: {"description": what, "content": {"text/event-stream": a2a} if streams
                  else ours},
            400: {"description": "A request A2A itself refuses (another A2A-Version, a body "
                  "that is not A2A's), as A2A's error", "content": ours},
            **shown}


def _offered(request: Request, agent: str) -> str:
    if agent not in offered(request.app.state.settings):
        raise NotFound(f"no agent {agent!r}")
    return agent


def _base(request: Request) -> str:
    return str(request.base_url)


@router.get("/.well-known/agent-card.json", summary="The default agent's A2A card",
            responses=_answers("The Agent Card (A2A 1.0)", 404))
async def host_card(request: Request, _: Public) -> Response:
    """The default agent's card (``CASETRAIL_A2A_DEFAULT_AGENT``, else the first one)."""
    settings = request.app.state.settings
    name = settings.a2a_default_agent or next(iter(offered(settings)))
    return OrjsonResponse(card_json(agent_card(AGENTS[_offered(request, name)],
                                               _base(request), settings)))


@router.get("/a2a/{agent}/.well-known/agent-card.json", summary="An agent's A2A card",
            responses=_answers("The Agent Card (A2A 1.0)", 404))
async def card(agent: str, request: Request, _: Public) -> Response:
    return OrjsonResponse(card_json(agent_card(AGENTS[_offered(request, agent)],
                                               _base(request), request.app.state.settings)))


@router.post("/a2a/{agent}/", summary="A2A JSON-RPC 2.0 (SendMessage, GetTask, ...)",
             responses=_answers("The JSON-RPC response, or Server-Sent Events for "
                                "SendStreamingMessage and SubscribeToTask", 401, 403, 404),
             openapi_extra=_extra("/", "POST", version_required=False))
async def rpc(agent: str, request: Request, principal: AnyKey) -> Response:
    """One JSON-RPC request: the method's scope first (403, as REST), then the SDK's
    dispatcher and ``CaseTasks``."""
    peeked = peek(await request.body())
    if peeked.too_deep:
        return OrjsonResponse(too_deep_answer(peeked.request_id))
    method = peeked.method
    _allowed(request, principal, SCOPES.get(method or ""), method)
    response: Response = await _dispatchers(request, _offered(request, agent))[
        0].handle_requests(request)
    return response


def _allowed(request: Request, principal: Principal, scope: Scope | None,
             what: str | None) -> None:
    """The method's scope (403, as REST), and what the handler needs of the request."""
    if scope is not None and not principal.allows(scope):
        raise Forbidden(f"this API key lacks the scope {scope.value!r} (needed for {what})")
    request.state.principal = principal
    request.state.base_url = _base(request)
    request.state.following = Following(
        request.app.state.watch, request.app.state.slots, request.app.state.cases.store,
        request.app.state.settings.stream_ping_seconds, still_valid(request))


REST: tuple[tuple[str, str, str, Scope], ...] = (
    ("/message:send", "POST", "on_message_send", Scope.START),
    ("/message:stream", "POST", "on_message_send_stream", Scope.START),
    ("/tasks/{id:a2a_task}:cancel", "POST", "on_cancel_task", Scope.CANCEL),
    ("/tasks/{id:a2a_task}:subscribe", "GET", "on_subscribe_to_task", Scope.READ),
    ("/tasks/{id:a2a_task}", "GET", "on_get_task", Scope.READ),
    ("/tasks", "GET", "list_tasks", Scope.READ),
)
"""A2A's HTTP+JSON binding, as the SDK's REST dispatcher serves it: path, method, the
dispatcher's method, the scope (push notifications and the extended card: not served)."""


def _rest(name: str, scope: Scope) -> Callable[..., Awaitable[Response]]:
    async def endpoint(agent: str, request: Request, principal: AnyKey) -> Response:
        _allowed(request, principal, scope, f"{request.method} {request.url.path}")
        rest = _dispatchers(request, _offered(request, agent))[1]
        response: Response = await getattr(rest, name)(request)
        return response
    return endpoint


for _path, _method, _name, _scope in REST:
    router.add_api_route(
        f"/a2a/{{agent}}{_path}", _rest(_name, _scope), methods=[_method],
        name=f"a2a {_method} {_path}", summary=f"A2A HTTP+JSON: {_name.removeprefix('on_')}",
        responses=_answers("A2A's answer", 401, 403, 404,
                           streams=_name in ("on_message_send_stream", "on_subscribe_to_task")),
        openapi_extra=_extra(_path, _method))


def _dispatchers(request: Request, agent: str) -> tuple[JsonRpcDispatcher, RestDispatcher]:
    """One pair of dispatchers an agent, kept for the app's life (the base URL a task's
    links use comes with each call: a Host header cannot grow this)."""
    state = request.app.state
    made: dict[str, tuple[JsonRpcDispatcher, RestDispatcher]] | None = getattr(
        state, "a2a", None)
    if made is None:
        made = state.a2a = {}
    if agent not in made:
        handler = CaseTasks(agent, request.app.state.cases)
        made[agent] = (JsonRpcDispatcher(request_handler=handler, context_builder=caller()),
                       RestDispatcher(request_handler=handler, context_builder=caller()))
    return made[agent]
