"""A recorded ``REACT_CYCLE`` as the conversation had it: the model's turn (its text and
tool calls, the final-answer call last) and what the model saw next. Resuming a case,
replaying it, and taking up a turn that waited for a person's answer all rebuild the
conversation with these, so it is the same each time."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from casetrail.engine.answers import FINAL_ANSWER, feedback
from casetrail.engine.chat import (
    AssistantMessage,
    ChatMessage,
    ToolCallRequest,
    ToolResultMessage,
    UserMessage,
)


def _final_call(cycle: Mapping[str, Any]) -> ToolCallRequest | None:
    """The final-answer call of a recorded cycle, as the model made it (an accepted
    answer's arguments give the same answer again)."""
    if isinstance(answer := cycle.get("answer"), dict):
        return ToolCallRequest(id=f"answer-{cycle['cycleIndex']}", name=FINAL_ANSWER,
                               arguments=answer)
    rejected = cycle.get("answerRejected")
    if isinstance(rejected, Mapping) and rejected.get("toolCallId"):
        given = rejected.get("answer")
        return ToolCallRequest(
            id=rejected["toolCallId"], name=FINAL_ANSWER,
            arguments=given if isinstance(given, dict) else None,
            raw_arguments=None if isinstance(given, dict) else str(given))
    return None


def recorded_calls(cycle: Mapping[str, Any]) -> tuple[ToolCallRequest, ...]:
    """The tool calls a recorded ``REACT_CYCLE``'s model turn asked for, as it asked (the
    final-answer call, which is not a tool call of the record, last)."""
    calls = tuple(
        ToolCallRequest(id=call.get("toolCallId") or f"call-{cycle['cycleIndex']}-{index}",
                        name=call["toolName"],
                        arguments=None if call.get("rawArgs") is not None else call["toolArgs"],
                        raw_arguments=call.get("rawArgs"))
        for index, call in enumerate(cycle.get("toolCalls") or []))
    final = _final_call(cycle)
    return calls if final is None else (*calls, final)


def cycle_messages(cycle: Mapping[str, Any]) -> list[ChatMessage]:
    """A recorded ``REACT_CYCLE`` as the conversation had it: the model's turn, then each
    call's observation (the same text the tool box gave the model), then what a refused
    answer told the model (the same words the engine used)."""
    calls = cycle.get("toolCalls") or []
    requests = recorded_calls(cycle)
    messages: list[ChatMessage] = [AssistantMessage(cycle["reasoningText"], requests)]
    for request, call in zip(requests, calls, strict=False):
        error = call.get("error")
        content = f"ERROR: {error}" if error else orjson.dumps(call.get("toolResult")).decode()
        messages.append(ToolResultMessage(request.id, request.name, content,
                                          is_error=error is not None))
    rejected = cycle.get("answerRejected")
    if isinstance(rejected, Mapping):
        told = feedback(rejected["errors"])
        if rejected.get("toolCallId"):
            messages.append(ToolResultMessage(rejected["toolCallId"], FINAL_ANSWER,
                                              f"ERROR: {told}", is_error=True))
        else:
            messages.append(UserMessage(told))
    return messages


def recorded_reply(call: Mapping[str, Any]) -> Any:
    """What the worker runtime answered a recorded call, from what the record holds: the
    one rule replay and backtests answer every tool kind by. A remote A2A agent's reply is
    its task as the record names it (``a2a``) with the task's artifacts (``toolResult``),
    which the tool box splits again as it did live; any other call's reply is its
    result as recorded."""
    remote = call.get("a2a")
    if isinstance(remote, Mapping):
        return {"a2a": dict(remote), "artifacts": call.get("toolResult")}
    return call.get("toolResult")
