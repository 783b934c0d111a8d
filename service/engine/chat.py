"""The chat-model interface every provider implements.

One call: the conversation so far and the tools on offer go in, one assistant
turn comes out. Providers (scripted, OpenAI-compatible, Anthropic) each live in
their own module behind this protocol; the engine knows nothing else of them.

Failures are typed (see ``casetrail.errors``): ``ModelUnavailable`` may be
retried, ``ModelRejected`` ends the case with ``model_error``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias

from casetrail.contract.events import ZERO_USAGE, TokenUsage


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool as the model sees it: a name, what it does, a JSON Schema for its arguments."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True, slots=True)
class SystemMessage:
    text: str


@dataclass(frozen=True, slots=True)
class UserMessage:
    text: str


@dataclass(frozen=True, slots=True)
class ToolCallRequest:
    """A tool call the model asked for.

    ``arguments`` is the parsed JSON object, or ``None`` when the model's
    arguments text was not a JSON object; ``raw_arguments`` keeps that text.
    """

    id: str
    name: str
    arguments: dict[str, Any] | None
    raw_arguments: str | None = None


@dataclass(frozen=True, slots=True)
class AssistantMessage:
    text: str
    tool_calls: tuple[ToolCallRequest, ...] = ()
    thinking: str | None = None
    provider_blocks: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True, slots=True)
class ToolResultMessage:
    """The observation for one tool call, as text the model reads."""

    tool_call_id: str
    tool_name: str
    content: str
    is_error: bool = False


ChatMessage: TypeAlias = SystemMessage | UserMessage | AssistantMessage | ToolResultMessage


def count_tokens(text: str) -> int:
    """A deterministic token estimate (about four characters a token)."""
    return max(1, (len(text) + 3) // 4) if text else 0


def message_text(message: ChatMessage) -> str:
    """The text of a message that counts against the context."""
    match message:
        case SystemMessage(text=text) | UserMessage(text=text):
            return text
        case AssistantMessage(text=text, tool_calls=calls):
            return text + "".join(c.name + (c.raw_arguments or "") for c in calls)
        case ToolResultMessage(content=content):
            return content


@dataclass(frozen=True, slots=True)
class AssistantTurn:
    """What one model request returns."""

    text: str
    tool_calls: tuple[ToolCallRequest, ...] = ()
    usage: TokenUsage = ZERO_USAGE  # immutable, so one instance serves every turn
    finish_reason: str = "stop"
    model: str = ""
    thinking: str | None = None
    provider_blocks: tuple[dict[str, Any], ...] = ()

    def as_message(self) -> AssistantMessage:
        return AssistantMessage(
            text=self.text,
            tool_calls=self.tool_calls,
            thinking=self.thinking,
            provider_blocks=self.provider_blocks,
        )


class ChatModel(Protocol):
    """``request(messages, tools) -> AssistantTurn``: the whole provider surface."""

    @property
    def name(self) -> str: ...

    async def request(
        self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]
    ) -> AssistantTurn: ...
