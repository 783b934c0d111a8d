"""A local HTTP server that speaks the OpenAI Chat Completions and Anthropic Messages
wire formats, answering from a script. casetrail's providers talk to it over real HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from tests.support.stack import free_port


@dataclass
class Reply:
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    """Seconds the server waits before answering."""


@dataclass
class FakeLLM:
    base_url: str
    script: list[Reply] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    peers: list[int] = field(default_factory=list)
    """The client port of each request: how many connections were used."""
    repeat_last: bool = False
    respond: Callable[[dict[str, Any]], Reply] | None = None
    """Answers each request from its body instead of the script (a model whose answer
    depends on the conversation, like a real one)."""


def openai_turn(text: str | None = None, calls: list[tuple[str, str, str]] = (),  # type: ignore[assignment]
                prompt: int = 11, completion: int = 7, finish: str | None = None,
                reasoning: str | None = None) -> Reply:
    """A Chat Completions response; ``calls`` are ``(id, name, arguments text)``."""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = [
            {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
            for i, n, a in calls
        ]
    if reasoning:
        message["reasoning_content"] = reasoning
    return Reply(200, {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-test",
        "choices": [{"index": 0, "message": message,
                     "finish_reason": finish or ("tool_calls" if calls else "stop")}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                  "total_tokens": prompt + completion},
    })


def anthropic_turn(blocks: list[dict[str, Any]], stop: str = "end_turn", prompt: int = 13,
                   completion: int = 5) -> Reply:
    return Reply(200, {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test",
        "content": blocks, "stop_reason": stop, "stop_sequence": None,
        "usage": {"input_tokens": prompt, "output_tokens": completion},
    })


def error(status: int, message: str, headers: dict[str, str] | None = None) -> Reply:
    return Reply(status, {"error": {"message": message, "type": "error"}}, headers or {})


@asynccontextmanager
async def fake_llm(tls: tuple[Path, Path] | None = None) -> AsyncIterator[FakeLLM]:
    """The server; ``tls`` (certificate, key): over https, as ``localhost``."""
    port = free_port()
    fake = FakeLLM(base_url=f"https://localhost:{port}" if tls else f"http://127.0.0.1:{port}")
    app = FastAPI()

    async def answer(request: Request) -> JSONResponse:
        fake.requests.append(await request.json())
        fake.headers.append(dict(request.headers))
        fake.peers.append(request.client.port if request.client else 0)
        if fake.respond is not None:
            reply = fake.respond(fake.requests[-1])
        elif not fake.script:
            return JSONResponse({"error": {"message": "script exhausted"}}, status_code=500)
        else:
            reply = fake.script[0] if (fake.repeat_last and len(fake.script) == 1) \
                else fake.script.pop(0)
        if reply.delay:
            await asyncio.sleep(reply.delay)
        return JSONResponse(reply.body, status_code=reply.status, headers=reply.headers)

    app.post("/v1/chat/completions")(answer)
    app.post("/v1/messages")(answer)
    server = uvicorn.Server(uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="error",
        ssl_certfile=str(tls[0]) if tls else None, ssl_keyfile=str(tls[1]) if tls else None))
    task = asyncio.create_task(server.serve())
    while not server.started:  # noqa: ASYNC110 - uvicorn exposes a flag, not an event
        await asyncio.sleep(0.01)
    try:
        yield fake
    finally:
        server.should_exit = True
        await task
