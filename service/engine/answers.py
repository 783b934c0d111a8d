"""Typed answers and checks (docs/design.md, "A case, step by step").

An agent's answer is a pydantic model. The model gives it by calling the final-answer
tool, whose parameters are that model's JSON schema (any provider with tool calling
supports it); the answer is not a tool of the ``ToolSource`` union and never appears in
``toolCalls``: its cycle records ``answer``, or ``answerRejected`` with the errors, which
the model is sent back (at most ``maxAnswerRetries`` times, then ``invalid_answer``).

Checks are an agent's named, versioned functions over the case's input, every recorded
tool call and the answer, each passing or failing with a detail, blocking or not. They
run before the terminal event, which carries their results; a failed blocking check
never lets an answer stand as an automated decision.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from pydantic import BaseModel, ValidationError

from casetrail.contract.events import (
    CheckResult,
    JsonObject,
    ReviewReason,
    describe_validation_error,
)
from casetrail.contract.integrity import canonical
from casetrail.engine.chat import (
    AssistantMessage,
    ChatMessage,
    ToolResultMessage,
    ToolSpec,
    UserMessage,
)

FINAL_ANSWER = "final_answer"
"""The tool the model calls to give its answer."""
DEFAULT_ANSWER_RETRIES = 2
ASK_A_PERSON = "ask_a_person"
"""The tool an agent that asks people questions offers the model: the case waits for a
person's answer, which is the call's result."""
ENGINE_TOOLS = frozenset({FINAL_ANSWER, ASK_A_PERSON})
"""The tools the engine itself offers: no agent's tool may take their names."""
ASK_A_PERSON_SPEC = ToolSpec(
    ASK_A_PERSON, "Ask a person (a reviewer) one question you cannot answer with your "
    "tools; the case waits until they answer, and their answer is this call's result.",
    {"type": "object", "properties": {"question": {
        "type": "string", "minLength": 1, "maxLength": 2000,
        "description": "The question, complete enough to answer without the case at hand."}},
     "required": ["question"], "additionalProperties": False})


@dataclass(frozen=True)
class CheckContext:
    """What a check sees: the case input, every tool call of the case so far as
    recorded (``toolName``, ``toolArgs``, ``toolResult`` or ``error``), and the answer;
    a case's sensitive values appear as themselves, not as the signed record's
    placeholders. Read only: the calls are the recorded events' own values."""

    input: JsonObject
    tool_calls: tuple[Mapping[str, Any], ...]
    answer: JsonObject

    def calls_to(self, tool: str) -> list[Mapping[str, Any]]:
        return [call for call in self.tool_calls if call.get("toolName") == tool]


CheckFn = Callable[[CheckContext], tuple[bool, str]]


@dataclass(frozen=True)
class Check:
    """A named, versioned check: ``fn`` says whether it passed and why."""

    name: str
    version: str
    fn: CheckFn
    blocking: bool = True

    def run(self, context: CheckContext) -> CheckResult:
        try:
            passed, detail = self.fn(context)
        except Exception as exc:  # a check that cannot decide does not pass
            passed, detail = False, f"the check could not run: {type(exc).__name__}: {exc}"
        return CheckResult(name=self.name, version=self.version, passed=passed,
                           blocking=self.blocking, detail=detail)


@functools.cache
def _schema(model: type[BaseModel]) -> dict[str, Any]:
    schema = model.model_json_schema(by_alias=True)
    schema.pop("title", None)
    return schema


@dataclass(frozen=True)
class Review:
    """Which answers a person decides: those whose ``field`` (``decision`` unless named)
    is one of ``decisions``, and, with ``failed_checks``, any answer a blocking check
    refused (instead of failing the case ``policy_check_failed``). ``deadline``: how
    long the review may take before it is overdue (counted, alerted on, marked; it never
    decides); ``None``: the tenant's or the deployment's."""

    decisions: frozenset[str] = frozenset()
    failed_checks: bool = True
    field: str = "decision"
    deadline: timedelta | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "decisions", frozenset(self.decisions))

    def reasons(self, answer: JsonObject, checks: Sequence[CheckResult]
                ) -> list[ReviewReason]:
        found: list[ReviewReason] = []
        if str(answer.get(self.field)) in self.decisions:
            found.append("decision")
        if self.failed_checks and refused(checks):
            found.append("failed_check")
        return found


@dataclass(frozen=True)
class Answering:
    """How a case's answer is given and judged: its model, the agent's checks, and
    which answers a person decides."""

    model: type[BaseModel]
    checks: tuple[Check, ...] = ()
    review: Review | None = None

    @property
    def spec(self) -> ToolSpec:
        return ToolSpec(FINAL_ANSWER, "Give your final answer: call this once, alone, when "
                        "you have decided. Its arguments are the answer.", _schema(self.model))

    @property
    def schema_digest(self) -> str:
        return hashlib.sha256(canonical(_schema(self.model))).hexdigest()

    def validate(self, given: Any) -> tuple[JsonObject | None, list[str]]:
        """The answer as the schema has it, or the reasons it is not one."""
        if not isinstance(given, dict):
            return None, ["the final answer's arguments must be a JSON object"]
        try:
            answer = self.model.model_validate(given)
        except ValidationError as exc:
            return None, [describe_validation_error(exc, "(answer)")]
        dumped: JsonObject = answer.model_dump(mode="json", by_alias=True)
        return dumped, []

    def judge(self, case_input: JsonObject, tool_calls: Sequence[Mapping[str, Any]],
              answer: JsonObject) -> tuple[CheckResult, ...]:
        context = CheckContext(case_input, tuple(tool_calls), answer)
        return tuple(check.run(context) for check in self.checks)


def feedback(errors: Sequence[str]) -> str:
    """What a refused answer tells the model (the same words on every attempt, so a
    resumed attempt rebuilds the conversation exactly)."""
    return ("Your answer was not accepted: " + "; ".join(errors) + f". Give your final "
            f"answer by calling {FINAL_ANSWER} alone, with arguments that match its schema.")


def refused(results: Sequence[CheckResult]) -> list[CheckResult]:
    """The blocking checks that failed."""
    return [r for r in results if r.blocking and not r.passed]


def returned_note(conversation: Sequence[ChatMessage], reason: str) -> ChatMessage:
    """What the model is told when a reviewer returns its answer: the result of its
    final-answer call (the conversation's last turn), or a message of its own. The same
    words on every attempt, so resume and replay rebuild the conversation exactly."""
    text = (f"A reviewer returned your answer: {reason}\nContinue the case and give your "
            f"final answer again by calling {FINAL_ANSWER}.")
    last = conversation[-1] if conversation else None
    if isinstance(last, AssistantMessage):
        finals = [c for c in last.tool_calls if c.name == FINAL_ANSWER]
        if finals:
            return ToolResultMessage(finals[-1].id, FINAL_ANSWER, text, is_error=True)
    return UserMessage(text)
