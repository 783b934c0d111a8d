"""A model server for the benchmarks: answers every request after 300 ms in the OpenAI
Chat Completions or the Anthropic Messages wire format, in a process of its own.

It is a plain asyncio protocol (HTTP/1.1, keep-alive, one timer per request, no task),
on uvloop like casetrail's components, so that it is not the bottleneck of what it
measures: ``bench.models`` prints its ceiling, a plain aiohttp client's requests/s at
the same concurrency, beside every figure. A case's first turn gets a tool call
(``debt-to-income``), a turn that carries a tool result gets the decision (a call of
the final-answer tool, as the loan officer's answer schema asks).

``python -m bench.slow_model openai|anthropic PORT``; ``GET /stats`` answers
``{"connections", "requests"}``: connections that sent a model request, and the
requests answered.
"""

from __future__ import annotations

import asyncio
import re
import sys
from typing import Any, Literal, cast

import orjson
import uvloop

TURN_SECONDS = 0.3
Provider = Literal["openai", "anthropic"]

_TOOL_RESULT = re.compile(rb'"role":\s*"tool"|"tool_result"')
_LENGTH = re.compile(rb"(?i)\r\ncontent-length:\s*(\d+)")
_ANSWER = {"decision": "refer", "applicantId": "A-1001",
           "rationale": "debt-to-income within policy; an underwriter decides"}
"""The decision, given as the loan officer's answer schema asks (the final-answer tool)."""


def reply_body(provider: Provider, second_turn: bool) -> bytes:
    text = "The debt-to-income ratio is acceptable." if second_turn \
        else "I will check the debt-to-income ratio."
    name, arguments = ("final_answer", _ANSWER) if second_turn else \
        ("debt-to-income", {"monthlyDebt": 2100, "monthlyIncome": 9000})
    if provider == "openai":
        message: dict[str, Any] = {"role": "assistant", "content": text, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {
                "name": name, "arguments": orjson.dumps(arguments).decode()}}]}
        return orjson.dumps({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "fake",
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
            "usage": {"prompt_tokens": 500, "completion_tokens": 30, "total_tokens": 530}})
    blocks = [{"type": "text", "text": text},
              {"type": "tool_use", "id": "toolu_1", "name": name, "input": arguments}]
    return orjson.dumps({
        "id": "msg_1", "type": "message", "role": "assistant", "model": "fake",
        "content": blocks, "stop_reason": "tool_use",
        "stop_sequence": None, "usage": {"input_tokens": 500, "output_tokens": 30}})


def _response(body: bytes) -> bytes:
    return (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body)


class Counts:
    connections = 0
    requests = 0


class SlowModel(asyncio.Protocol):
    """One connection: reads a request, answers it ``TURN_SECONDS`` later."""

    def __init__(self, answers: tuple[bytes, bytes]) -> None:
        self._answers = answers
        self._buffer = b""
        self._transport: asyncio.Transport | None = None
        self._counted = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while True:
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self._buffer[:end]
            found = _LENGTH.search(head)
            length = int(found.group(1)) if found else 0
            if len(self._buffer) < end + 4 + length:
                return
            body = self._buffer[end + 4:end + 4 + length]
            self._buffer = self._buffer[end + 4 + length:]
            self._request(head, body)

    def _request(self, head: bytes, body: bytes) -> None:
        transport = self._transport
        assert transport is not None
        if head.startswith(b"GET /stats"):
            transport.write(_response(orjson.dumps(
                {"connections": Counts.connections, "requests": Counts.requests})))
            return
        if not self._counted:
            self._counted = True
            Counts.connections += 1
        answer = self._answers[1 if _TOOL_RESULT.search(body) else 0]
        asyncio.get_running_loop().call_later(TURN_SECONDS, self._answer, answer)

    def _answer(self, answer: bytes) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(answer)
            Counts.requests += 1

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None


async def serve(provider: Provider, port: int) -> None:
    answers = (_response(reply_body(provider, False)), _response(reply_body(provider, True)))
    server = await asyncio.get_running_loop().create_server(
        lambda: SlowModel(answers), "127.0.0.1", port, backlog=4096)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    provider: Any = sys.argv[1]
    uvloop.run(serve(provider, int(sys.argv[2])))
