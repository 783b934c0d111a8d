"""The GenAI spans of one attempt: ``invoke_agent``, ``chat`` and ``execute_tool``.

Made only when tracing is on (``tracing.ENABLED``); the engine keeps one
``AttemptTrace`` per attempt, or ``None``. Content attributes follow the
conventions' JSON shapes and are written only when the opt-in variable asks
for them, through the case's redaction (placeholders for sensitive values).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import orjson
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind

from casetrail.contract.events import CaseStatus
from casetrail.engine.chat import (
    AssistantMessage,
    AssistantTurn,
    ChatMessage,
    SystemMessage,
    ToolResultMessage,
    message_text,
)
from casetrail.telemetry import tracing

Redact = Callable[[str], str]


def _parts(message: ChatMessage) -> dict[str, Any]:
    match message:
        case SystemMessage():
            return {"role": "system", "parts": [{"type": "text", "content": message.text}]}
        case ToolResultMessage():
            return {"role": "tool", "parts": [{"type": "tool_call_response",
                                               "id": message.tool_call_id,
                                               "response": message.content}]}
        case AssistantMessage():
            parts: list[dict[str, Any]] = [{"type": "text", "content": message.text}]
            parts += [{"type": "tool_call", "id": c.id, "name": c.name,
                       "arguments": c.arguments} for c in message.tool_calls]
            return {"role": "assistant", "parts": parts}
        case _:
            return {"role": "user", "parts": [{"type": "text",
                                               "content": message_text(message)}]}


@dataclass
class AttemptTrace:
    """The spans of one attempt; its ``invoke_agent`` span is current while it runs."""

    span: Span
    provider: str
    redact: Redact
    _token: object = field(default=None, repr=False)
    _current: object = field(default=None, repr=False)

    @classmethod
    def begin(cls, *, agent: str, agent_version: str, case_id: str, attempt: int,
              provider: str, model: str, redact: Redact) -> AttemptTrace:
        span = tracing.start(f"invoke_agent {agent}", SpanKind.INTERNAL, {
            tracing.OPERATION: "invoke_agent", tracing.PROVIDER: provider,
            tracing.AGENT_NAME: agent, tracing.AGENT_VERSION: agent_version,
            tracing.CONVERSATION: case_id, tracing.REQUEST_MODEL: model,
            "casetrail.case.id": case_id, "casetrail.case.attempt": attempt,
        })
        begun = cls(span, provider, redact)
        begun._token = otel_context.attach(trace.set_span_in_context(span))
        begun._current = _CURRENT.set(begun)
        return begun

    def end(self, outcome: str, reason: str | None, input_tokens: int,
            output_tokens: int) -> None:
        self.span.set_attributes({tracing.INPUT_TOKENS: input_tokens,
                                  tracing.OUTPUT_TOKENS: output_tokens,
                                  "casetrail.case.outcome": outcome})
        if outcome not in (CaseStatus.COMPLETED, CaseStatus.CANCELLED):
            tracing.failed(self.span, reason or outcome)
        self.finish()

    def finish(self) -> None:
        """End the span (also when the attempt was abandoned, with no terminal event)."""
        if self._token is not None:
            otel_context.detach(self._token)  # type: ignore[arg-type]
            _CURRENT.reset(self._current)  # type: ignore[arg-type]
            self._token = None
        self.span.end()

    def chat(self, model: str, prompt: Sequence[ChatMessage]) -> Span:
        span = tracing.start(f"chat {model}", SpanKind.CLIENT, {
            tracing.OPERATION: "chat", tracing.PROVIDER: self.provider,
            tracing.REQUEST_MODEL: model})
        if tracing.CAPTURE_CONTENT:
            span.set_attribute(tracing.INPUT_MESSAGES, self._json([_parts(m) for m in prompt]))
        return span

    def answered(self, span: Span, turn: AssistantTurn) -> None:
        span.set_attributes({
            tracing.RESPONSE_MODEL: turn.model or "", tracing.INPUT_TOKENS: turn.usage.input_tokens,
            tracing.OUTPUT_TOKENS: turn.usage.output_tokens,
            tracing.FINISH_REASONS: [turn.finish_reason]})
        if tracing.CAPTURE_CONTENT:
            span.set_attribute(tracing.OUTPUT_MESSAGES,
                               self._json([_parts(turn.as_message())]))
        span.end()

    def _json(self, value: Any) -> str:
        return self.redact(orjson.dumps(value).decode())


_CURRENT: ContextVar[AttemptTrace | None] = ContextVar("casetrail_attempt_trace",
                                                      default=None)


def _content(value: Any) -> str | None:
    """``value`` as the current attempt redacts it, when content is asked for."""
    attempt = _CURRENT.get()
    if not tracing.CAPTURE_CONTENT or attempt is None:
        return None
    return attempt.redact(orjson.dumps(value).decode())


def tool_span(name: str, call_id: str, tool_type: str, arguments: Any) -> Span:
    """An ``execute_tool`` span, a child of the current span (the attempt's)."""
    span = tracing.start(f"execute_tool {name}", SpanKind.INTERNAL, {
        tracing.OPERATION: "execute_tool", tracing.TOOL_NAME: name,
        tracing.TOOL_CALL_ID: call_id, tracing.TOOL_TYPE: tool_type})
    content = _content(arguments)
    if content is not None:
        span.set_attribute(tracing.TOOL_ARGUMENTS, content)
    return span


def tool_done(span: Span, error: str | None, result: Any) -> None:
    if error is not None:
        tracing.failed(span, "tool_error", error)
    elif (content := _content(result)) is not None:
        span.set_attribute(tracing.TOOL_RESULT, content)
    span.end()
