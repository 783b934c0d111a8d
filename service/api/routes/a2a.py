"""A2A's routes (service/api/a2a.py; docs/a2a.md): the agents' cards, public, and each
agent's two bindings, authenticated as REST is: JSON-RPC at ``/a2a/{agent}/`` and
HTTP+JSON under ``/a2a/{agent}`` (``/message:send``, ``/tasks/{id}``, …). They follow
A2A's own contract, not the OpenAPI document's."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from a2a.server.routes.jsonrpc_dispatcher import JsonRpcDispatcher
from a2a.server.routes.rest_dispatcher import RestDispatcher
from fastapi import APIRouter, Request, Response

from casetrail.agents import AGENTS
from casetrail.api.a2a import SCOPES, CaseTasks, caller, method_of
from casetrail.api.a2a_cards import agent_card, card_json
from casetrail.api.a2a_stream import Following
from casetrail.api.deps import AnyKey, Public
from casetrail.api.routes.cases import OrjsonResponse
from casetrail.api.routes.streams import still_valid
from casetrail.cases import offered
from casetrail.cases.errors import Forbidden, NotFound
from casetrail.contract.auth import Principal, Scope

router = APIRouter()


def _offered(request: Request, agent: str) -> str:
    if agent not in offered(request.app.state.settings):
        raise NotFound(f"no agent {agent!r}")
    return agent


def _base(request: Request) -> str:
    return str(request.base_url)


@router.get("/.well-known/agent-card.json", include_in_schema=False)
async def host_card(request: Request, _: Public) -> Response:
    """The default agent's card (``CASETRAIL_A2A_DEFAULT_AGENT``, else the first one)."""
    settings = request.app.state.settings
    name = settings.a2a_default_agent or next(iter(offered(settings)))
    return OrjsonResponse(card_json(agent_card(AGENTS[_offered(request, name)],
                                               _base(request), settings)))


@router.get("/a2a/{agent}/.well-known/agent-card.json", include_in_schema=False)
async def card(agent: str, request: Request, _: Public) -> Response:
    return OrjsonResponse(card_json(agent_card(AGENTS[_offered(request, agent)],
                                               _base(request), request.app.state.settings)))


@router.post("/a2a/{agent}/", include_in_schema=False)
async def rpc(agent: str, request: Request, principal: AnyKey) -> Response:
    """One JSON-RPC request: the method's scope first (403, as REST), then the SDK's
    dispatcher and ``CaseTasks``."""
    method = method_of(await request.body())
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
    ("/tasks/{id}:cancel", "POST", "on_cancel_task", Scope.CANCEL),
    ("/tasks/{id}:subscribe", "GET", "on_subscribe_to_task", Scope.READ),
    ("/tasks/{id}", "GET", "on_get_task", Scope.READ),
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
    router.add_api_route(f"/a2a/{{agent}}{_path}", _rest(_name, _scope), methods=[_method],
                         include_in_schema=False, name=f"a2a {_method} {_path}")


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
