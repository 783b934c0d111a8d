"""OpenAI-compatible Chat Completions with tools (OpenAI, vLLM, Ollama, LM Studio,
gateways): ``POST {baseUrl}/chat/completions``, built and read here, sent by the
process's shared client (``clients``).

Nothing retries below the engine: it retries transient failures within the case
deadline and records each retry in the trail.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from casetrail.contract.events import TokenUsage
from casetrail.engine.chat import (
    AssistantMessage,
    AssistantTurn,
    ChatMessage,
    SystemMessage,
    ToolCallRequest,
    ToolResultMessage,
    ToolSpec,
    UserMessage,
)
from casetrail.providers.clients import RemoteChatModel


def parse_arguments(raw: str | None) -> dict[str, Any] | None:
    """The tool arguments as a JSON object, or ``None`` when they are not one."""
    try:
        value = orjson.loads(raw or "{}")
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def to_wire(message: ChatMessage) -> dict[str, Any]:
    match message:
        case SystemMessage(text=text):
            return {"role": "system", "content": text}
        case UserMessage(text=text):
            return {"role": "user", "content": text}
        case AssistantMessage(text=text, tool_calls=calls):
            wire: dict[str, Any] = {"role": "assistant", "content": text or None}
            if calls:
                wire["tool_calls"] = [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {
                            "name": call.name,
                            "arguments": call.raw_arguments
                            if call.arguments is None
                            else orjson.dumps(call.arguments).decode(),
                        },
                    }
                    for call in calls
                ]
            return wire
        case ToolResultMessage(tool_call_id=call_id, content=content):
            return {"role": "tool", "tool_call_id": call_id, "content": content}


class OpenAIChatModel(RemoteChatModel):
    """``ChatModel`` over ``POST {base_url}/chat/completions``."""

    async def request(
        self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]
    ) -> AssistantTurn:
        extra: dict[str, Any] = {}
        if tools:
            extra["tools"] = [
                {"type": "function", "function": {"name": t.name, "description": t.description,
                                                  "parameters": t.parameters}}
                for t in tools
            ]
        if self._max_tokens:
            extra["max_tokens"] = self._max_tokens
        body = {"model": self._model, "messages": [to_wire(m) for m in messages], **extra}
        return from_wire(await self._client.post("/chat/completions", body), self._model)


def from_wire(data: dict[str, Any], default_model: str) -> AssistantTurn:
    """An assistant turn from a Chat Completions response body."""
    choice = (data.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    calls = tuple(
        ToolCallRequest(
            id=call["id"],
            name=call["function"]["name"],
            arguments=parse_arguments(call["function"].get("arguments")),
            raw_arguments=call["function"].get("arguments"),
        )
        for call in message.get("tool_calls") or []
    )
    usage = data.get("usage") or {}
    thinking = message.get("reasoning_content") or message.get("reasoning") or None
    return AssistantTurn(
        text=message.get("content") or "",
        tool_calls=calls,
        usage=TokenUsage(input_tokens=usage.get("prompt_tokens") or 0,
                         output_tokens=usage.get("completion_tokens") or 0),
        finish_reason=choice.get("finish_reason") or "unknown",
        model=data.get("model") or default_model,
        thinking=thinking if isinstance(thinking, str) else None,
    )
