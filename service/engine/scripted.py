"""The scripted chat model: a real implementation of ``ChatModel`` driven by data.

Tests and the demo use it. Its turns are either a fixed list, or a function of
the conversation so far (the way the sample agents reason deterministically
from their input and the observations they received). Token usage is counted
deterministically from the text, so totals are reproducible.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import orjson

from casetrail.contract.events import TokenUsage
from casetrail.engine.chat import (
    AssistantTurn,
    ChatMessage,
    ToolCallRequest,
    ToolSpec,
    count_tokens,
    message_text,
)
from casetrail.errors import ModelRejected

ScriptFn = Callable[[Sequence[ChatMessage]], AssistantTurn]


class ScriptedModel:
    """Replays ``turns`` in order, or asks ``script`` for the next turn.

    ``latency`` (seconds) makes every turn take that long, to exercise
    deadlines, cancellation and concurrency.
    """

    def __init__(
        self,
        turns: Sequence[AssistantTurn] | ScriptFn,
        *,
        name: str = "scripted",
        latency: float = 0.0,
    ) -> None:
        self._turns = turns
        self._name = name
        self._latency = latency
        self._served = 0
        # Token estimates per message object (the conversation only grows, so each
        # message is counted once, not once per turn).
        self._counted: dict[int, tuple[ChatMessage, int]] = {}
        self._counted_tools: dict[int, tuple[Sequence[ToolSpec], int]] = {}
        self._prompt: tuple[tuple[ChatMessage, ...], int] = ((), 0)

    @property
    def name(self) -> str:
        return self._name

    async def request(
        self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]
    ) -> AssistantTurn:
        if self._latency:
            await asyncio.sleep(self._latency)
        if callable(self._turns):
            turn = self._turns(messages)
        else:
            if self._served >= len(self._turns):
                raise ModelRejected(f"script exhausted after {self._served} turns")
            turn = self._turns[self._served]
        self._served += 1
        prompt = self._count_prompt(messages) + self._count_tools(tools)
        completion = count_tokens(turn.text) + sum(
            count_tokens(c.name + orjson.dumps(c.arguments).decode()) for c in turn.tool_calls
        )
        return AssistantTurn(
            text=turn.text,
            tool_calls=turn.tool_calls,
            usage=TokenUsage(input_tokens=prompt, output_tokens=completion),
            finish_reason="tool_calls" if turn.tool_calls else "stop",
            model=self._name,
        )


    def _count_tools(self, tools: Sequence[ToolSpec]) -> int:
        known = self._counted_tools.get(id(tools))
        if known is not None and known[0] is tools:
            return known[1]
        tokens = sum(count_tokens(t.name + t.description)
                     + count_tokens(orjson.dumps(t.parameters).decode()) for t in tools)
        self._counted_tools[id(tools)] = (tools, tokens)
        return tokens

    def _count_prompt(self, messages: Sequence[ChatMessage]) -> int:
        # The conversation grows by appending, so the total of the last prompt is
        # reused when this one starts with the very same message objects.
        seen, total = self._prompt
        if len(messages) >= len(seen) and all(
            a is b for a, b in zip(seen, messages[: len(seen)], strict=True)
        ):
            total += sum(self._count(m) for m in messages[len(seen):])
        else:
            total = sum(self._count(m) for m in messages)
        self._prompt = (tuple(messages), total)
        return total

    def _count(self, message: ChatMessage) -> int:
        known = self._counted.get(id(message))
        if known is not None and known[0] is message:
            return known[1]
        tokens = count_tokens(message_text(message))
        self._counted[id(message)] = (message, tokens)
        return tokens


def call(tool: str, call_id: str, **arguments: object) -> ToolCallRequest:
    """Shorthand for a scripted tool call."""
    return ToolCallRequest(id=call_id, name=tool, arguments=dict(arguments))
