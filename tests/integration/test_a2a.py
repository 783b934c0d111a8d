"""casetrail agents as A2A servers, driven by the official ``a2a-sdk`` client (not our
own): discovered by their cards, a message starts a case (the task is the case), the
task followed to COMPLETED with the typed answer artifact, a case waiting for a
reviewer seen as WORKING, cancel, list, InvalidParams for bad input, and the same
authentication and scopes as REST."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest
from a2a.client import A2AClientError, Client, ClientConfig, create_client
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
    TaskState,
)
from a2a.utils.errors import (
    InternalError,
    InvalidParamsError,
    TaskNotCancelableError,
    TaskNotFoundError,
)
from google.protobuf.json_format import MessageToDict, ParseDict
from google.protobuf.struct_pb2 import Value

from casetrail.adapters.store import ApiKeyStore
from casetrail.agents.loan_officer import SAMPLE_APPLICATIONS
from tests.support.helpers import ended, wait_until
from tests.support.stack import InProcessStack, module_stack

stack = module_stack(worker_concurrency=4)
TERMINAL = (TaskState.TASK_STATE_COMPLETED, TaskState.TASK_STATE_FAILED,
            TaskState.TASK_STATE_CANCELED)


@pytest.fixture
async def a2a(stack: InProcessStack, auth_headers: dict[str, str]) -> AsyncIterator[Client]:
    """The official SDK's client for the loan officer, from its card, with our API key."""
    async with httpx.AsyncClient(headers=auth_headers, timeout=10) as http:
        client = await create_client(f"{stack.base_url}/a2a/loan-officer/",
                                     ClientConfig(httpx_client=http, streaming=False))
        yield client
        await client.close()


def message(data: Any, message_id: str | None = None) -> SendMessageRequest:
    return SendMessageRequest(message=Message(
        message_id=message_id or uuid.uuid4().hex, role=Role.ROLE_USER,
        parts=[Part(data=ParseDict(data, Value()))]))


async def send(client: Client, request: SendMessageRequest) -> Task:
    tasks = [event.task async for event in client.send_message(request)]
    assert len(tasks) == 1
    return tasks[0]


async def settled(client: Client, task_id: str, *also: int) -> Task:
    async def check() -> Task | None:
        task = await client.get_task(GetTaskRequest(id=task_id))
        return task if task.status.state in (*TERMINAL, *also) else None

    found: Task = await wait_until(check, timeout=20)
    return found


async def test_the_cards_say_what_any_caller_may_know(stack: InProcessStack) -> None:
    async with httpx.AsyncClient(base_url=stack.base_url) as http:  # no credentials
        card = (await http.get("/a2a/loan-officer/.well-known/agent-card.json")).json()
        host = (await http.get("/.well-known/agent-card.json")).json()
        unknown = await http.get("/a2a/nobody/.well-known/agent-card.json")
    assert card["name"] == "loan-officer" and "+" in card["version"]  # version+agentDigest
    assert card["supportedInterfaces"] == [
        {"url": f"{stack.base_url}/a2a/loan-officer/", "protocolBinding": "JSONRPC",
         "protocolVersion": "1.0"},
        {"url": f"{stack.base_url}/a2a/loan-officer", "protocolBinding": "HTTP+JSON",
         "protocolVersion": "1.0"}]
    (skill,) = card["skills"]
    assert "applicantId" in skill["description"] and skill["inputModes"] == [
        "application/json"]
    assert card["securitySchemes"]["apiKey"]["httpAuthSecurityScheme"]["scheme"] == "Bearer"
    assert card["capabilities"]["streaming"] is True
    assert host["name"] in {"loan-officer", "aml-screening"} and host["skills"]
    assert unknown.status_code == 404


async def test_a_message_starts_a_case_and_the_task_completes_with_the_answer(
    a2a: Client, client: httpx.AsyncClient,
) -> None:
    # The SDK carries whole numbers as floats (25000.0): the input takes them as integers.
    request = message(SAMPLE_APPLICATIONS[0])
    task = await send(a2a, request)
    assert task.status.state in (TaskState.TASK_STATE_SUBMITTED, TaskState.TASK_STATE_WORKING)
    case_id = task.id
    assert (await client.get(f"/cases/{case_id}")).json()["input"]["loanAmount"] == 25000
    again = await send(a2a, request)  # the same messageId: the same task, no second case
    assert again.id == case_id
    done = await settled(a2a, case_id)
    assert done.status.state == TaskState.TASK_STATE_COMPLETED, MessageToDict(done)
    artifacts = {a.name: a for a in done.artifacts}
    answer = MessageToDict(artifacts["answer"].parts[0])["data"]
    assert answer == (await client.get(f"/cases/{case_id}")).json()["answer"]
    assert MessageToDict(artifacts["decision"].parts[0])["data"]["decidedBy"] == "agent"
    assert MessageToDict(artifacts["integrity"].parts[0])["data"]["verified"] is True
    assert [p.url.rsplit("/", 1)[1] for p in artifacts["evidence"].parts] == ["bundle",
                                                                             "report"]
    # The trail says it came over A2A: the start the API signed names the messageId.
    events = (await client.get(f"/cases/{case_id}/events")).json()["events"]
    start = events[0]["payload"]["startAction"]["signed"]
    assert start["via"] == {"protocol": "a2a",
                            "messageId": request.message.message_id}, start
    assert (await client.get(f"/cases/{case_id}/verify")).json()["verified"] is True
    listed = await a2a.list_tasks(ListTasksRequest(page_size=50))
    assert case_id in {t.id for t in listed.tasks}
    with pytest.raises(TaskNotCancelableError):
        await a2a.cancel_task(CancelTaskRequest(id=case_id))


async def test_a_case_waiting_for_a_reviewer_is_working_and_says_for_whom(
    a2a: Client,
) -> None:
    tasks = [await send(a2a, message(sample)) for sample in SAMPLE_APPLICATIONS]
    states = [await settled(a2a, t.id, TaskState.TASK_STATE_WORKING) for t in tasks]

    async def one_waits() -> list[Task] | None:
        now = [await a2a.get_task(GetTaskRequest(id=t.id)) for t in tasks]
        waiting = [t for t in now if t.status.state == TaskState.TASK_STATE_WORKING
                   and "waiting for" in t.status.message.parts[0].text]
        return waiting or None

    waiting = await wait_until(one_waits, timeout=20)
    assert "reviewer" in waiting[0].status.message.parts[0].text, states


async def test_bad_input_is_invalid_params_and_nothing_is_kept(
    a2a: Client, pool: asyncpg.Pool,
) -> None:
    before = await pool.fetchval("SELECT count(*) FROM cases")
    with pytest.raises(InvalidParamsError) as refused:
        await send(a2a, message({**SAMPLE_APPLICATIONS[0], "loanAmount": -5}))
    assert "loanAmount" in str(refused.value)
    with pytest.raises(InvalidParamsError):
        await send(a2a, SendMessageRequest(message=Message(
            message_id="x", role=Role.ROLE_USER, parts=[Part(text="lend me money")])))
    with pytest.raises(TaskNotFoundError):
        await a2a.get_task(GetTaskRequest(id=str(uuid.uuid4())))
    assert await pool.fetchval("SELECT count(*) FROM cases") == before


async def test_a_streamed_task_says_each_cycle_and_ends_with_its_answer(
    stack: InProcessStack, auth_headers: dict[str, str],
) -> None:
    async with httpx.AsyncClient(headers=auth_headers, timeout=30) as http:
        client = await create_client(f"{stack.base_url}/a2a/loan-officer/",
                                     ClientConfig(httpx_client=http, streaming=True))
        try:
            events = [event async for event in client.send_message(
                message(SAMPLE_APPLICATIONS[0]))]
        finally:
            await client.close()
    assert events[0].HasField("task") and events[-1].HasField("task")
    said = [e.status_update.status.message.parts[0].text for e in events
            if e.HasField("status_update")]
    assert said[0].startswith("started") and sum("cycle" in s for s in said) == 4, said
    last = events[-1].task
    assert last.status.state == TaskState.TASK_STATE_COMPLETED and last.id == events[0].task.id
    assert [a.name for a in last.artifacts] == ["answer", "decision", "integrity", "evidence"]


async def test_a_running_task_is_cancelled_and_a_subscriber_sees_it_end(
    stack: InProcessStack, auth_headers: dict[str, str], a2a: Client,
    client: httpx.AsyncClient,
) -> None:
    slow = {"provider": "scripted", "name": "slow", "latencyMs": 1500}
    reply = await client.post("/cases", json={"agent": "loan-officer", "model": slow,
                                              "input": SAMPLE_APPLICATIONS[0]})
    case_id = reply.json()["caseId"]
    async with httpx.AsyncClient(headers=auth_headers, timeout=30) as http:
        subscriber = await create_client(f"{stack.base_url}/a2a/loan-officer/",
                                         ClientConfig(httpx_client=http, streaming=True))
        try:
            seen: list[Any] = []

            async def watch() -> None:
                async for event in subscriber.subscribe(SubscribeToTaskRequest(id=case_id)):
                    seen.append(event)

            watching = asyncio.create_task(watch())
            await wait_until(lambda: _first(seen), timeout=10)
            await a2a.cancel_task(CancelTaskRequest(id=case_id))
            await asyncio.wait_for(watching, 20)
        finally:
            await subscriber.close()
    assert seen[0].task.id == case_id
    assert seen[-1].task.status.state == TaskState.TASK_STATE_CANCELED
    assert (await ended(client, case_id))["status"] == "cancelled"


async def _first(seen: list[Any]) -> bool:
    return bool(seen)


async def test_the_http_json_binding_serves_the_same_tasks(
    stack: InProcessStack, auth_headers: dict[str, str], pool: asyncpg.Pool,
) -> None:
    async with httpx.AsyncClient(headers=auth_headers, timeout=30) as http:
        rest = await create_client(f"{stack.base_url}/a2a/loan-officer/", ClientConfig(
            httpx_client=http, streaming=True, supported_protocol_bindings=["HTTP+JSON"],
            use_client_preference=True))
        try:
            events = [e async for e in rest.send_message(message(SAMPLE_APPLICATIONS[0]))]
            done = events[-1].task
            assert done.status.state == TaskState.TASK_STATE_COMPLETED
            again = await rest.get_task(GetTaskRequest(id=done.id))
            assert again.id == done.id and again.artifacts[0].name == "answer"
            assert done.id in {t.id for t in (await rest.list_tasks(ListTasksRequest())).tasks}
            with pytest.raises(TaskNotCancelableError):
                await rest.cancel_task(CancelTaskRequest(id=done.id))
            with pytest.raises(InvalidParamsError):
                await send(rest, message({**SAMPLE_APPLICATIONS[0], "loanAmount": -5}))
        finally:
            await rest.close()
    _, reader = await ApiKeyStore(pool).create("default", ("cases:read",), "a2a reader")
    async with httpx.AsyncClient(base_url=stack.base_url) as http:
        url = "/a2a/loan-officer/message:send"
        body = MessageToDict(message(SAMPLE_APPLICATIONS[0]))
        assert (await http.post(url, json=body)).status_code == 401
        refused = await http.post(url, json=body, headers={
            "Authorization": f"Bearer {reader}", "A2A-Version": "1.0"})
        assert refused.status_code == 403 and "cases:start" in refused.text


async def test_a_failed_case_is_a_failed_task_with_its_reason_code(
    a2a: Client, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    reply = await client.post("/cases", json={
        "agent": "loan-officer", "input": SAMPLE_APPLICATIONS[0],
        "model": {"provider": "anthropic", "name": "claude-x"}})
    failed = await settled(a2a, reply.json()["caseId"])
    assert failed.status.state == TaskState.TASK_STATE_FAILED
    assert failed.status.message.parts[0].text.startswith("failed: model_error: ")
    assert MessageToDict(failed.metadata)["casetrail"]["reasonCode"] == "model_error"
    assert not failed.artifacts


async def test_another_tenants_tasks_are_not_found(
    stack: InProcessStack, a2a: Client, pool: asyncpg.Pool,
) -> None:
    ours = await send(a2a, message(SAMPLE_APPLICATIONS[0]))
    _, other = await ApiKeyStore(pool).create("a2a-other", ("cases:read", "cases:cancel"),
                                              "another tenant")
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {other}"}) as http:
        theirs = await create_client(f"{stack.base_url}/a2a/loan-officer/",
                                     ClientConfig(httpx_client=http, streaming=False))
        try:
            with pytest.raises(TaskNotFoundError):
                await theirs.get_task(GetTaskRequest(id=ours.id))
            with pytest.raises(TaskNotFoundError):
                await theirs.cancel_task(CancelTaskRequest(id=ours.id))
            listed = await theirs.list_tasks(ListTasksRequest())
            assert ours.id not in {t.id for t in listed.tasks}
        finally:
            await theirs.close()


async def test_the_same_credentials_and_scopes_as_rest(
    stack: InProcessStack, pool: asyncpg.Pool,
) -> None:
    url = f"{stack.base_url}/a2a/loan-officer/"
    body = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": MessageToDict(
        message(SAMPLE_APPLICATIONS[0]))}
    _, reader = await ApiKeyStore(pool).create("default", ("cases:read",), "a2a reader")
    async with httpx.AsyncClient(timeout=10) as http:
        anonymous = await http.post(url, json=body, headers={"A2A-Version": "1.0"})
        assert anonymous.status_code == 401 and anonymous.headers["www-authenticate"] == \
            "Bearer"
        refused = await http.post(url, json=body, headers={
            "Authorization": f"Bearer {reader}", "A2A-Version": "1.0"})
        assert refused.status_code == 403 and "cases:start" in refused.text, refused.text
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {reader}"}) as http:
        client = await create_client(url, ClientConfig(httpx_client=http, streaming=False))
        try:
            with pytest.raises((A2AClientError, httpx.HTTPStatusError)):
                await send(client, message(SAMPLE_APPLICATIONS[0]))
            assert (await client.list_tasks(ListTasksRequest())).tasks is not None
        finally:
            await client.close()


async def test_a_request_nested_too_deep_is_an_invalid_request_saying_why(
    stack: InProcessStack, pool: asyncpg.Pool,
) -> None:
    """A body nested thousands deep made the SDK's parser fail with Python's "maximum
    recursion depth" as an internal error (-32603); it is an Invalid Request, plainly."""
    _, key = await ApiKeyStore(pool).create("default", ("cases:read",), "a2a deep")
    deep = b'{"jsonrpc": "2.0", "id": 7, "method": "GetTask", "params": {"id": ' + \
        b"[" * 5000 + b"]" * 5000 + b"}}"
    async with httpx.AsyncClient(timeout=10, headers={
            "Authorization": f"Bearer {key}", "A2A-Version": "1.0",
            "Content-Type": "application/json"}) as http:
        reply = await http.post(f"{stack.base_url}/a2a/loan-officer/", content=deep)
    assert reply.status_code == 200, reply.text
    answer = reply.json()
    # Too deep even to be read: its id is not known (JSON-RPC answers null then).
    assert answer["id"] is None and answer["error"]["code"] == -32600, answer
    assert "nest deeper than 64 levels" in answer["error"]["message"]
    assert "recursion" not in reply.text
    # Readable but deeper than the limit: refused the same way, its id kept.
    readable = b'{"jsonrpc": "2.0", "id": 7, "method": "GetTask", "params": {"id": ' + \
        b"[" * 100 + b"]" * 100 + b"}}"
    async with httpx.AsyncClient(timeout=10, headers={
            "Authorization": f"Bearer {key}", "A2A-Version": "1.0",
            "Content-Type": "application/json"}) as http:
        answer = (await http.post(f"{stack.base_url}/a2a/loan-officer/",
                                  content=readable)).json()
    assert answer["id"] == 7 and answer["error"]["code"] == -32600, answer


async def test_a_tenant_over_its_quota_is_told_when_to_retry_and_nothing_is_kept(
    stack: InProcessStack, pool: asyncpg.Pool,
) -> None:
    """The same rate limit as REST's 429: an A2A error naming when to retry."""
    _, hasty = await ApiKeyStore(pool).create("a2a-hasty", ("cases:start", "cases:read"),
                                              "a2a quota")
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {hasty}"},
                                 timeout=10) as http:
        client = await create_client(f"{stack.base_url}/a2a/loan-officer/",
                                     ClientConfig(httpx_client=http, streaming=False))
        try:
            await send(client, message(SAMPLE_APPLICATIONS[0]))
            with pytest.raises(InternalError) as refused:
                await send(client, message(SAMPLE_APPLICATIONS[1]))
        finally:
            await client.close()
    assert "started 1 cases in the last minute" in str(refused.value), refused.value
    assert "retry after" in str(refused.value)
    assert int(getattr(refused.value, "data", {})["retryAfter"]) >= 1
    assert await pool.fetchval("SELECT count(*) FROM cases WHERE tenant_id = 'a2a-hasty'") == 1
