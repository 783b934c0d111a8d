"""The capability worker's side of one remote A2A agent: the official ``a2a-sdk``
client, serving the capability ``a2a-<agent>`` (docs/a2a.md, "Remote agents as tools").

Each call reads the agent's card and checks it against the digest the operator pinned
(a card that differs is refused, naming both digests, until the operator accepts the
new one), sends one message (the call's idempotency key as its ``messageId``), and
follows the task to its end within the agent's ``timeoutSeconds``: streaming where the
card says it streams, polling otherwise. The reply names the task (id, context, final
state) and carries its artifacts; a task left waiting for input or for authorization,
failed, rejected or cancelled is a tool error naming its state.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import httpx
import orjson

from casetrail.a2a import A2aRequest
from casetrail.config import A2aAgent, https_or_loopback
from casetrail.contract.integrity import canonical
from casetrail.engine.tools import Capability, ToolFailed, a2a_capability
from casetrail.errors import PermanentError
from casetrail.privacy.sensitive import PLACEHOLDER

if TYPE_CHECKING:
    from a2a.client import Client
    from a2a.types.a2a_pb2 import AgentCard, Task

log = logging.getLogger("casetrail.a2a")

POLL_SECONDS = 0.25
"""How often a task is read again when its agent does not stream."""

ENDED_WELL = "TASK_STATE_COMPLETED"
STOPPED = ("TASK_STATE_FAILED", "TASK_STATE_REJECTED", "TASK_STATE_CANCELED",
           "TASK_STATE_INPUT_REQUIRED", "TASK_STATE_AUTH_REQUIRED")
"""The states a task rests in without an answer: each is a tool error naming it."""


def card_digest(card: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of a card's RFC 8785 JSON: what ``cardDigest`` pins."""
    return hashlib.sha256(canonical(dict(card))).hexdigest()


async def read_card(agent: A2aAgent, http: httpx.AsyncClient) -> dict[str, Any]:
    """The agent's card as it serves it now; a network failure or a 5xx may pass
    (``ToolFailed``, retryable), a 4xx or what is not a JSON object does not."""
    try:
        answer = await http.get(agent.card_url)
    except httpx.HTTPError as exc:
        raise ToolFailed(f"A2A agent {agent.name!r}: its card could not be read "
                         f"({type(exc).__name__}: {exc})", retryable=True) from exc
    if answer.status_code >= 500:
        raise ToolFailed(f"A2A agent {agent.name!r}: its card answered "
                         f"{answer.status_code}", retryable=True)
    if answer.status_code != 200:
        raise ToolFailed(f"A2A agent {agent.name!r}: its card answered "
                         f"{answer.status_code}", retryable=False)
    try:
        card = orjson.loads(answer.content)
    except orjson.JSONDecodeError as exc:
        raise ToolFailed(f"A2A agent {agent.name!r}: its card is not JSON",
                         retryable=False) from exc
    if not isinstance(card, dict):
        raise ToolFailed(f"A2A agent {agent.name!r}: its card is not a JSON object",
                         retryable=False)
    return card


def card_interfaces(agent: A2aAgent, card: Mapping[str, Any]) -> None:
    """Every endpoint the card names (``url``, ``supportedInterfaces``,
    ``additionalInterfaces``) held to the rule ``cardUrl`` is held to: https, or plain
    http to a loopback address; the agent's credentials (``headersEnv``) go there, so
    one that breaks it is refused before anything is sent (``ToolFailed``, for good)."""
    urls = [card.get("url")] + [
        entry.get("url") for key in ("supportedInterfaces", "additionalInterfaces")
        for entry in (card.get(key) or []) if isinstance(entry, Mapping)]
    for url in urls:
        if url is None:
            continue
        try:
            https_or_loopback(str(url), f"A2A agent {agent.name!r}: the card's interface")
        except ValueError as exc:
            raise ToolFailed(f"{exc}; refused before its credentials were sent",
                             retryable=False) from exc


def pinned(agent: A2aAgent, card: Mapping[str, Any]) -> str:
    """The card's digest, when it is the one the operator pinned; otherwise why not."""
    digest = card_digest(card)
    if agent.card_digest is None:
        raise ToolFailed(f"A2A agent {agent.name!r}: no card is pinned; it serves "
                         f"{digest} now (set cardDigest to it to accept that card)",
                         retryable=False)
    if digest != agent.card_digest:
        raise ToolFailed(f"A2A agent {agent.name!r}: its card changed (pinned "
                         f"{agent.card_digest}, served {digest}); refused until the "
                         "operator accepts it (cardDigest)", retryable=False)
    return digest


class RemoteAgent:
    """One remote A2A agent as its capability worker sees it."""

    def __init__(self, agent: A2aAgent) -> None:
        self.agent = agent

    def sensitive_refusal(self, args: Mapping[str, Any], values: Mapping[str, str]
                          ) -> str | None:
        """Why a call may not carry a case's sensitive values where they are (none:
        it may): only in the input fields the operator lists for this agent."""
        arguments = args.get("arguments")
        if not values or not isinstance(arguments, dict):
            return None
        allowed = set(self.agent.sensitive_fields)
        carrying = sorted(key for key, value in arguments.items()
                          if key not in allowed and PLACEHOLDER.search(orjson.dumps(
                              value).decode()))
        if not carrying:
            return None
        return (f"A2A agent {self.agent.name!r} may not be sent a sensitive value in "
                f"{', '.join(carrying)} (its sensitiveFields: "
                f"{', '.join(sorted(allowed)) or 'none'})")

    async def answer(self, request: A2aRequest) -> dict[str, Any]:
        """Send the message, follow the task, answer with the record and artifacts."""
        from a2a.client import A2AClientError, ClientConfig, create_client

        try:
            headers = self.agent.headers()
        except PermanentError as exc:
            raise ToolFailed(str(exc), retryable=False) from exc
        # Redirects are never followed: one could take the credentials to another host.
        async with httpx.AsyncClient(headers=headers, timeout=self.agent.timeout_seconds,
                                     follow_redirects=False) as http:
            card_json = await read_card(self.agent, http)
            digest = pinned(self.agent, card_json)
            card_interfaces(self.agent, card_json)
            card = _card(card_json)
            streams = bool(card.capabilities.streaming)
            client = await create_client(card, ClientConfig(
                httpx_client=http, streaming=streams, polling=not streams))
            task: Task | None = None
            try:
                async with asyncio.timeout(self.agent.timeout_seconds):
                    task = await _follow(client, _message(request))
            except TimeoutError:
                raise ToolFailed(f"A2A agent {self.agent.name!r}: the task did not end "
                                 f"within {self.agent.timeout_seconds:g} s",
                                 retryable=True) from None
            except (A2AClientError, httpx.HTTPError) as exc:
                raise ToolFailed(f"A2A agent {self.agent.name!r}: "
                                 f"{type(exc).__name__}: {exc}", retryable=True) from exc
            finally:
                await client.close()
        return _reply(self.agent.name, digest, task)


def _card(card_json: Mapping[str, Any]) -> AgentCard:
    from a2a.types.a2a_pb2 import AgentCard
    from google.protobuf.json_format import ParseDict, ParseError

    try:
        return ParseDict(dict(card_json), AgentCard(), ignore_unknown_fields=True)
    except ParseError as exc:
        raise ToolFailed(f"not an A2A agent card: {exc}", retryable=False) from exc


def _message(request: A2aRequest) -> Any:
    from a2a.types.a2a_pb2 import Message, Part, Role, SendMessageRequest
    from google.protobuf.json_format import ParseDict
    from google.protobuf.struct_pb2 import Struct, Value

    if request.text:
        part = Part(text=str(request.arguments.get("text", "")))
    else:
        part = Part(data=ParseDict(request.arguments, Value()))
    metadata = Struct()
    if request.skill is not None:
        metadata.update({"skill": request.skill})
    return SendMessageRequest(message=Message(
        message_id=request.message_id, role=Role.ROLE_USER, parts=[part]), metadata=metadata)


async def _follow(client: Client, message: Any) -> Task:
    """The task the message started, followed until it rests."""
    from a2a.types.a2a_pb2 import GetTaskRequest

    task_id: str | None = None
    async for event in client.send_message(message):
        if event.HasField("message"):  # answered at once, without a task
            return _as_task(event.message)
        if event.HasField("task"):
            task_id = event.task.id
        elif event.HasField("status_update"):
            task_id = event.status_update.task_id
    if task_id is None:
        raise ToolFailed("the agent answered with neither a task nor a message",
                         retryable=False)
    while True:
        task = await client.get_task(GetTaskRequest(id=task_id))
        state = _state(task)
        if state == ENDED_WELL or state in STOPPED:
            return task
        await asyncio.sleep(POLL_SECONDS)


def _as_task(message: Any) -> Task:
    """A direct message as a completed task whose one artifact holds its parts."""
    from a2a.types.a2a_pb2 import Artifact, Task, TaskState, TaskStatus

    return Task(id="", context_id=message.context_id,
                status=TaskStatus(state=TaskState.TASK_STATE_COMPLETED),
                artifacts=[Artifact(artifact_id="message", name="message",
                                    parts=message.parts)])


def _state(task: Task) -> str:
    from a2a.types.a2a_pb2 import TaskState

    return str(TaskState.Name(task.status.state))


def _reply(agent: str, digest: str, task: Task) -> dict[str, Any]:
    from google.protobuf.json_format import MessageToDict

    state = _state(task)
    if state != ENDED_WELL:
        said = MessageToDict(task.status.message) if task.status.HasField("message") else {}
        texts = [part.get("text") for part in said.get("parts", []) if part.get("text")]
        raise ToolFailed(f"A2A agent {agent!r}: task {task.id} ended {state}"
                         + (f": {' '.join(texts)}" if texts else ""), retryable=False)
    return {"a2a": {"cardDigest": digest, "taskId": task.id or None,
                    "contextId": task.context_id or None, "state": state},
            "artifacts": [MessageToDict(artifact) for artifact in task.artifacts]}


def serving(agent: A2aAgent) -> Capability[A2aRequest]:
    """The capability ``a2a-<agent>``: its calls answered through the SDK's client."""
    remote = RemoteAgent(agent)
    return Capability(a2a_capability(agent.name), A2aRequest, remote.answer,
                      admits=remote.sensitive_refusal)


async def read_cards(agents: list[A2aAgent]) -> dict[str, dict[str, Any] | str]:
    """Each agent's card digest now, beside the pinned one (or why it could not be read):
    for an operator pinning or checking a configuration (``casetrail a2a-agents``)."""
    read: dict[str, dict[str, Any] | str] = {}
    for agent in agents:
        try:
            async with httpx.AsyncClient(headers=agent.headers(), timeout=10,
                                         follow_redirects=False) as http:
                card = await read_card(agent, http)
        except (ToolFailed, PermanentError) as exc:
            read[agent.name] = str(exc)
            continue
        served = card_digest(card)
        read[agent.name] = {"name": card.get("name"), "served": served,
                            "pinned": agent.card_digest,
                            "accepted": served == agent.card_digest}
    return read
