"""A2A 1.0: every casetrail agent an A2A server, and the task is the case (docs/a2a.md).

``POST /a2a/{agent}/`` speaks A2A's JSON-RPC binding through the official SDK's
dispatcher (methods, error codes, protobuf's JSON), answered by ``CaseTasks``, which
does what REST does with the same case operations (service/cases): ``SendMessage``
starts a case from the message's data part (its ``messageId`` the idempotency key),
``GetTask`` reads it, ``ListTasks`` lists the tenant's cases of the agent,
``CancelTask`` asks it to stop. The caller authenticates as for REST (an API key or an
OIDC token), and each method needs REST's scope for the same act. The task id is the
case id (so is the context id); the states follow the case's status; a completed task
carries the typed answer, the checks and who decided, the trail's integrity, and where
the evidence bundle and report are. ``SendStreamingMessage`` and ``SubscribeToTask``
follow the case's event stream (service/api/a2a_stream.py). Push notifications are not
served: the cards say so.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any, NoReturn

import orjson
from a2a.server.context import ServerCallContext
from a2a.server.events.event_queue import Event
from a2a.server.request_handlers.request_handler import RequestHandler
from a2a.server.routes.common import DefaultServerCallContextBuilder
from a2a.types.a2a_pb2 import (
    AgentCard,
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetExtendedAgentCardRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTaskPushNotificationConfigsResponse,
    ListTasksRequest,
    ListTasksResponse,
    Message,
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
    TaskPushNotificationConfig,
)
from a2a.utils.errors import (
    ExtendedAgentCardNotConfiguredError,
    InternalError,
    InvalidParamsError,
    InvalidRequestError,
    PushNotificationNotSupportedError,
    TaskNotCancelableError,
    TaskNotFoundError,
)
from google.protobuf.json_format import MessageToDict
from starlette.requests import Request

from casetrail import cases
from casetrail.adapters.store.search import case_summary
from casetrail.api.a2a_stream import follow
from casetrail.api.a2a_tasks import task_of
from casetrail.cases.errors import Conflict, Invalid, NotFound, OverQuota
from casetrail.cases.requests import CaseRequest
from casetrail.cases.services import CaseServices
from casetrail.contract.auth import Principal, Scope
from casetrail.contract.events import ENDED_STATUSES

SCOPES: dict[str, Scope] = {
    "SendMessage": Scope.START, "SendStreamingMessage": Scope.START,
    "GetTask": Scope.READ, "ListTasks": Scope.READ, "SubscribeToTask": Scope.READ,
    "CancelTask": Scope.CANCEL,
}
"""The scope each method needs: REST's for the same act (others need none: they are
refused as not served)."""
MAX_MESSAGE_ID = 190
"""A ``messageId`` becomes the idempotency key ``a2a:<messageId>`` (200 at most)."""


class _Caller(DefaultServerCallContextBuilder):
    """The call's context with what the route put on the request: the principal it
    authenticated, the base URL a task's links use, how to follow a case."""

    def build(self, request: Request) -> ServerCallContext:
        context = super().build(request)
        for name in ("principal", "base_url", "following"):
            context.state[name] = getattr(request.state, name)
        return context


def caller() -> DefaultServerCallContextBuilder:
    return _Caller()


def _problem(exc: Exception) -> NoReturn:
    """A case operation's refusal as A2A's error (what REST says as a problem)."""
    if isinstance(exc, Invalid):
        raise InvalidParamsError(exc.detail, data={"errors": [
            {"field": ".".join(map(str, issue.loc)), "message": issue.msg}
            for issue in exc.issues]}) from None
    if isinstance(exc, NotFound):  # an expired case too
        raise TaskNotFoundError(exc.detail) from None
    if isinstance(exc, OverQuota):
        raise InternalError(f"{exc.detail} (retry after {exc.retry_after} s)",
                            data={"retryAfter": str(exc.retry_after)}) from None
    if isinstance(exc, Conflict):
        raise InvalidRequestError(exc.detail) from None
    raise exc


class CaseTasks(RequestHandler):
    """One agent's A2A tasks, which are its cases."""

    def __init__(self, agent: str, services: CaseServices) -> None:
        self.agent = agent
        self.services = services

    @staticmethod
    def _principal(context: ServerCallContext) -> Principal:
        principal: Principal = context.state["principal"]
        return principal

    def _case_id(self, task_id: str) -> uuid.UUID:
        try:
            return uuid.UUID(task_id)
        except ValueError:
            raise TaskNotFoundError(f"no task {task_id!r}: a task id is a case id") from None

    async def _task(self, context: ServerCallContext, case_id: uuid.UUID) -> Task:
        """The task as it is now: a case that has not ended from its row alone (a client
        polls it), an ended one from the whole case read (its answer and its trail's
        integrity are the task's artifacts)."""
        principal = self._principal(context)
        try:
            view = await cases.status(self.services, principal, case_id)
            if view["agent"] != self.agent:
                raise TaskNotFoundError(f"no task {case_id} of agent {self.agent!r}")
            if view["status"] in ENDED_STATUSES:
                view = await cases.get(self.services, principal, case_id)
        except (NotFound, Invalid) as exc:
            _problem(exc)
        return task_of(view, context.state["base_url"])

    async def on_message_send(self, params: SendMessageRequest,
                              context: ServerCallContext) -> Task | Message:
        principal = self._principal(context)
        message = params.message
        if message.task_id:
            raise InvalidRequestError(
                "a casetrail task takes no further message: its agent asks a person, never "
                "the caller; start a new task")
        if len(message.message_id) > MAX_MESSAGE_ID:
            raise InvalidParamsError(f"messageId is longer than {MAX_MESSAGE_ID} characters",
                                     data={"errors": [{"field": "message.messageId",
                                                       "message": "too long"}]})
        data = [MessageToDict(part)["data"] for part in message.parts if part.HasField("data")]
        if len(data) != 1 or not isinstance(data[0], dict):
            raise InvalidParamsError(
                "the message needs exactly one data part holding the agent's input (a JSON "
                "object, as the card's skill says)", data={"errors": [
                    {"field": "message.parts", "message": f"{len(data)} data parts"}]})
        try:
            request = CaseRequest.model_validate({"agent": self.agent, "input": data[0]})
            started = await cases.start(self.services, principal, request,
                                        f"a2a:{message.message_id}",
                                        {"protocol": "a2a", "messageId": message.message_id})
        except (Invalid, Conflict, OverQuota) as exc:
            _problem(exc)
        if not started.created:  # the same messageId again: the task as it is now
            return await self._task(context, started.case["case_id"])
        return task_of(case_summary(started.case), context.state["base_url"])

    async def on_get_task(self, params: GetTaskRequest,
                          context: ServerCallContext) -> Task | None:
        return await self._task(context, self._case_id(params.id))

    async def on_list_tasks(self, params: ListTasksRequest,
                            context: ServerCallContext) -> ListTasksResponse:
        principal = self._principal(context)
        size = params.page_size or 50
        try:
            page = await cases.search(self.services, principal, agent=self.agent,
                                      limit=min(max(size, 1), 200),
                                      cursor=params.page_token or None)
        except Invalid as exc:
            _problem(exc)
        if params.include_artifacts:
            tasks = [await self._task(context, uuid.UUID(item["caseId"]))
                     for item in page["items"]]
        else:
            tasks = [task_of(item, context.state["base_url"]) for item in page["items"]]
        return ListTasksResponse(tasks=tasks, next_page_token=page.get("nextCursor") or "",
                                 page_size=len(tasks))

    async def on_cancel_task(self, params: CancelTaskRequest,
                             context: ServerCallContext) -> Task | None:
        principal = self._principal(context)
        case_id = self._case_id(params.id)
        await self._task(context, case_id)  # this agent's, and the caller's tenant's
        try:
            await cases.cancel(self.services, principal, case_id, "cancelled over A2A")
        except Conflict as exc:
            raise TaskNotCancelableError(exc.detail) from None
        except NotFound as exc:
            _problem(exc)
        return await self._task(context, case_id)

    async def on_message_send_stream(self, params: SendMessageRequest,
                                     context: ServerCallContext) -> AsyncGenerator[Event]:
        task = await self.on_message_send(params, context)
        assert isinstance(task, Task)
        async for event in self._follow(task, context):
            yield event

    async def on_subscribe_to_task(self, params: SubscribeToTaskRequest,
                                   context: ServerCallContext) -> AsyncGenerator[Event]:
        task = await self._task(context, self._case_id(params.id))
        async for event in self._follow(task, context):
            yield event

    def _follow(self, task: Task, context: ServerCallContext) -> AsyncGenerator[Event]:
        principal = self._principal(context)
        return follow(task, context.state["following"], principal.subject, principal.tenant,
                      lambda: self._task(context, uuid.UUID(task.id)))

    async def on_get_extended_agent_card(self, params: GetExtendedAgentCardRequest,
                                         context: ServerCallContext) -> AgentCard:
        raise ExtendedAgentCardNotConfiguredError(
            "no extended card: the public card says all there is")

    async def on_create_task_push_notification_config(
            self, params: TaskPushNotificationConfig,
            context: ServerCallContext) -> TaskPushNotificationConfig:
        _no_push()

    async def on_get_task_push_notification_config(
            self, params: GetTaskPushNotificationConfigRequest,
            context: ServerCallContext) -> TaskPushNotificationConfig:
        _no_push()

    async def on_list_task_push_notification_configs(
            self, params: ListTaskPushNotificationConfigsRequest,
            context: ServerCallContext) -> ListTaskPushNotificationConfigsResponse:
        _no_push()

    async def on_delete_task_push_notification_config(
            self, params: DeleteTaskPushNotificationConfigRequest,
            context: ServerCallContext) -> None:
        _no_push()


def _no_push() -> NoReturn:
    raise PushNotificationNotSupportedError(
        "push notifications are not served: poll GetTask, or subscribe to the case's "
        "events on the bus")


MAX_NESTING = 64
"""How deep a JSON-RPC request's arrays and objects may nest. A message's data rarely
nests a handful of levels; the SDK's parser fails past Python's recursion limit with an
internal error, so deeper is refused first as an Invalid Request that says why."""


@dataclass(frozen=True)
class RpcPeek:
    """What a JSON-RPC request names before the SDK reads it: its method (``None``: not
    one; the dispatcher says so), its id, and whether it nests too deep."""

    method: str | None
    request_id: str | int | None
    too_deep: bool


def peek(body: bytes) -> RpcPeek:
    try:
        parsed: Any = orjson.loads(body)
    except orjson.JSONDecodeError:  # orjson too refuses to nest past its own limit
        return RpcPeek(None, None, _raw_depth(body) > MAX_NESTING)
    if not isinstance(parsed, dict):
        return RpcPeek(None, None, _deeper_than(parsed, MAX_NESTING))
    method, request_id = parsed.get("method"), parsed.get("id")
    return RpcPeek(method if isinstance(method, str) else None,
                   request_id if isinstance(request_id, str | int)
                   and not isinstance(request_id, bool) else None,
                   _deeper_than(parsed, MAX_NESTING))


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value``'s arrays and objects nest more than ``limit`` levels (walked
    without recursion, so no depth can exhaust the stack)."""
    pending = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        children = item.values() if isinstance(item, dict) else \
            item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        pending.extend((child, depth + 1) for child in children
                       if isinstance(child, dict | list))
    return False


def _raw_depth(body: bytes) -> int:
    """How deep the brackets of a body that is not JSON nest, strings skipped."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in body:
        if in_string:
            escaped, in_string = (False, True) if escaped else (byte == 0x5C, byte != 0x22)
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest


def too_deep_answer(request_id: str | int | None) -> dict[str, Any]:
    """The JSON-RPC Invalid Request answer to a request that nests too deep."""
    return {"jsonrpc": "2.0", "id": request_id, "error": {
        "code": -32600, "message": f"Invalid Request: its arrays and objects nest deeper "
                                   f"than {MAX_NESTING} levels"}}

