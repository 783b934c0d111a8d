"""A model of our own for tests: a local HTTP server that speaks the OpenAI Chat
Completions wire format (what vLLM, Ollama or LM Studio serve locally), answering by a
few rules instead of weights. casetrail's own OpenAI client talks to it over real HTTP,
so a test exercises the same path as a deployment pointed at a local model."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route


def _call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [{
        "id": f"call-{name}", "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)}}]}


def _turn(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The "model": read the coverage, then decide from it."""
    claim = next(json.loads(m["content"].split("\n", 1)[1]) for m in messages
                 if m["role"] == "user" and str(m["content"]).startswith("Case input:"))
    results = {m.get("name") or m["tool_call_id"].removeprefix("call-"): m["content"]
               for m in messages if m["role"] == "tool"}
    if "policies_coverage" not in results:
        return _call("policies_coverage", {"policy_number": claim["policyNumber"],
                                           "claimant_name": claim["claimantName"]})
    coverage = json.loads(results["policies_coverage"])
    if not coverage["holderMatches"]:
        answer = {"decision": "investigate", "payout": 0, "reason": "not the holder"}
    else:
        answer = {"decision": "pay", "reason": "covered, deductible applied",
                  "payout": max(0, min(claim["amount"] - coverage["deductible"],
                                       coverage["coverageLimit"]))}
    return _call("final_answer", answer)


async def _completions(request: Request) -> JSONResponse:
    body = await request.json()
    request.app.state.requests.append(body)
    return JSONResponse({
        "id": "chatcmpl-local", "object": "chat.completion", "created": 0,
        "model": body["model"],
        "choices": [{"index": 0, "message": _turn(body["messages"]),
                     "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}})


@asynccontextmanager
async def local_model() -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """The server's base URL (``http://127.0.0.1:PORT/v1``) and the requests it got."""
    app = Starlette(routes=[Route("/v1/chat/completions", _completions, methods=["POST"])])
    app.state.requests = []
    listening = socket.socket()  # listening before the server runs: nothing is refused
    listening.bind(("127.0.0.1", 0))
    listening.listen(64)
    port = listening.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    serving = asyncio.create_task(server.serve(sockets=[listening]))
    try:
        yield f"http://127.0.0.1:{port}/v1", app.state.requests
    finally:
        server.should_exit = True
        await serving
        listening.close()
