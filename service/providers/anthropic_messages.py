"""Anthropic Messages with tool use: ``POST {baseUrl}/v1/messages``, built and read
here, sent by the process's shared client (``clients``).

Thinking blocks become part of ``reasoningText`` and are sent back verbatim
(with their signatures) on the next turn, as the API requires.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

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

DEFAULT_MAX_TOKENS = 4096


def to_wire(messages: Sequence[ChatMessage]) -> tuple[str, list[dict[str, Any]]]:
    """``(system, messages)``: tool results of one turn travel in one user message."""
    system: list[str] = []
    wire: list[dict[str, Any]] = []
    for message in messages:
        match message:
            case SystemMessage(text=text):
                system.append(text)
            case UserMessage(text=text):
                wire.append({"role": "user", "content": [{"type": "text", "text": text}]})
            case AssistantMessage(text=text, tool_calls=calls, provider_blocks=blocks):
                content = list(blocks) if blocks else (
                    ([{"type": "text", "text": text}] if text else [])
                    + [{"type": "tool_use", "id": c.id, "name": c.name,
                        "input": c.arguments or {}} for c in calls]
                )
                wire.append({"role": "assistant", "content": content})
            case ToolResultMessage(tool_call_id=call_id, content=content, is_error=is_error):
                block = {"type": "tool_result", "tool_use_id": call_id, "content": content,
                         "is_error": is_error}
                if wire and wire[-1]["role"] == "user" and all(
                    b.get("type") == "tool_result" for b in wire[-1]["content"]
                ):
                    wire[-1]["content"].append(block)
                else:
                    wire.append({"role": "user", "content": [block]})
    return "\n\n".join(system), wire


def from_wire(data: dict[str, Any], default_model: str) -> AssistantTurn:
    """An assistant turn from a Messages response body."""
    blocks: list[dict[str, Any]] = data.get("content") or []
    texts = [b.get("text", "") for b in blocks if b.get("type") == "text"]
    thinking = [b.get("thinking", "") for b in blocks if b.get("type") == "thinking"]
    calls = tuple(
        ToolCallRequest(
            id=b["id"], name=b["name"],
            arguments=b.get("input") if isinstance(b.get("input"), dict) else None,
            raw_arguments=None if isinstance(b.get("input"), dict) else str(b.get("input")),
        )
        for b in blocks if b.get("type") == "tool_use"
    )
    usage = data.get("usage") or {}
    return AssistantTurn(
        text="\n".join(texts),
        tool_calls=calls,
        usage=TokenUsage(input_tokens=usage.get("input_tokens") or 0,
                         output_tokens=usage.get("output_tokens") or 0),
        finish_reason=data.get("stop_reason") or "unknown",
        model=data.get("model") or default_model,
        thinking="\n".join(thinking) or None,
        provider_blocks=tuple(blocks),
    )


class AnthropicChatModel(RemoteChatModel):
    """``ChatModel`` over ``POST {base_url}/v1/messages``."""

    default_max_tokens = DEFAULT_MAX_TOKENS

    async def request(
        self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]
    ) -> AssistantTurn:
        system, wire = to_wire(messages)
        extra: dict[str, Any] = {}
        if system:
            extra["system"] = system
        if tools:
            extra["tools"] = [{"name": t.name, "description": t.description,
                               "input_schema": t.parameters} for t in tools]
        body = {"model": self._model, "max_tokens": self._max_tokens, "messages": wire,
                **extra}
        return from_wire(await self._client.post("/v1/messages", body), self._model)
