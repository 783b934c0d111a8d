"""What one attempt of a case is, for the engine: its spec (``CaseSpec``: input, limits,
model, what earlier attempts left, ``Resumption``), the cancel signal, the sink its events
go to, the state it runs in (``RunState``: the conversation, kept within the context
budget by ``fit_to_budget``), and how a prose answer and the first message are read and
written. The loop that runs it is ``service/engine/loop.py``."""

from __future__ import annotations

import asyncio
import hashlib
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import Enum
from typing import Any, Protocol

import orjson

from casetrail.contract.events import (
    DEFAULT_TENANT,
    MAX_EVENT_BYTES,
    ZERO_USAGE,
    CaseAwaitingReview,
    CaseReviewedPayload,
    CheckResult,
    Event,
    JsonObject,
    Limits,
    ModelRef,
    ModelRetry,
    PendingQuestion,
    ResumedFrom,
    ReviewReason,
    TerminalEvent,
    TokenUsage,
)
from casetrail.engine.answers import (
    Answering,
)
from casetrail.engine.chat import (
    ChatMessage,
    ToolResultMessage,
    ToolSpec,
    count_tokens,
    message_text,
)
from casetrail.engine.observing import AttemptWatch


class EventSink(Protocol):
    """Where the loop's events go; ``emit`` returns once the event is durable (confirmed)."""

    async def emit(self, event: Event) -> None: ...


@dataclass
class CancelSignal:
    """Set by whoever wants the case to stop; checked before every model call and during calls."""

    event: asyncio.Event = field(default_factory=asyncio.Event)
    reason: str | None = None
    by: str | None = None
    """Who asked (``key:<keyId>``), recorded in CASE_CANCELLED."""
    _guarded: set[asyncio.Task[Any]] = field(default_factory=set)
    _interrupted: set[asyncio.Task[Any]] = field(default_factory=set)

    def cancel(self, reason: str | None = None, by: str | None = None) -> None:
        """Ask the case to stop; a model or tool call in flight is abandoned now.
        Call it from the event loop's thread."""
        self.reason, self.by = reason, by
        self.event.set()
        self.interrupt()

    def interrupt(self) -> None:
        """Abandon the model or tool call in flight, if any (cancel, or the deadline)."""
        for task in self._guarded:
            self._interrupted.add(task)
            task.cancel()

    def guard(self, task: asyncio.Task[Any]) -> None:
        """``task`` is running a call that ``interrupt`` abandons."""
        self._guarded.add(task)

    def unguard(self, task: asyncio.Task[Any]) -> None:
        self._guarded.discard(task)

    def took_interruption(self, task: asyncio.Task[Any]) -> bool:
        """Whether a cancellation of ``task`` came from ``interrupt`` (answered once)."""
        if task in self._interrupted:
            self._interrupted.discard(task)
            return True
        return False

    @property
    def is_set(self) -> bool:
        return self.event.is_set()


AttemptEnd = TerminalEvent | CaseAwaitingReview
"""How an attempt the loop runs to its end ends: the case's terminal event, or parked."""


@dataclass(frozen=True)
class Parked:
    """The case's last wait for a person, as recorded: the answer and checks it waited
    with (or the model's question and its turn), and the review recorded since
    (``None``: nobody has acted on it yet)."""

    attempt: int
    answer: JsonObject | None
    checks: tuple[CheckResult, ...]
    review: CaseReviewedPayload | None = None
    question: PendingQuestion | None = None
    asked_at: datetime | None = None
    reasons: tuple[ReviewReason, ...] = ()


@dataclass(frozen=True)
class GivenAnswer:
    """A person's answer to the model's question, as the API kept it."""

    call_id: str
    answer: str
    answered_by: JsonObject
    answered_at: datetime
    action: JsonObject | None = None
    """What the API signed (docs/bundle.md, "A person's action"); the question's
    result carries it."""


@dataclass(frozen=True)
class Resumption:
    """What an attempt carries over from the record of the attempts before it."""

    resumed_from: ResumedFrom
    messages: tuple[ChatMessage, ...]
    """The recorded cycles' model turns and observations, after the case input."""
    cycles: int
    usage: TokenUsage
    tool_calls: tuple[Mapping[str, Any], ...] = ()
    """Every recorded tool call, as recorded (what the checks see)."""
    rejections: int = 0
    """Answers refused so far."""
    answer: JsonObject | None = None
    """The answer the last recorded cycle gave (then only its checks and terminal event
    are left to do)."""
    parked: Parked | None = None
    """The last wait for a person, when the record ends in one (or in its review)."""
    returns: int = 0
    """Times a reviewer returned the case to the model (each allows ``maxCycles`` more)."""
    reviewers: tuple[tuple[str, str], ...] = ()
    """Who reviewed the case so far, in order, as ``(via, subject)`` (four eyes on a
    second review)."""


@dataclass(frozen=True)
class CaseSpec:
    """Everything that defines one attempt of a case."""

    case_id: uuid.UUID
    attempt: int
    agent: str
    system_prompt: str
    input: JsonObject
    limits: Limits
    model: ModelRef
    restart_reason: str | None = None
    agent_version: str = "unversioned"
    tenant_id: str = DEFAULT_TENANT
    started_by: str | None = None
    context_budget: int | None = None
    """Tokens the conversation may take; beyond it the oldest observations are shortened."""
    resumption: Resumption | None = None
    deadline_at: datetime | None = None
    """When the case's deadline passes (from its first attempt's start); ``None``: the
    deadline counts from this attempt's start."""
    agent_digest: str | None = None
    """What defines the agent, hashed (``AgentProfile.digest``)."""
    answering: Answering | None = None
    """The agent's answer schema and checks (``None``: the answer is taken from the
    model's last text, for agents that declare none)."""
    review_every_case: bool = False
    """The tenant has a person decide every case."""
    override_reviewers: int = 1
    """How many distinct persons an override takes (the tenant's four-eyes rule): with
    2, an override waits for a second person (``second_review``)."""
    review: CaseReviewedPayload | None = None
    """A person's review of the parked case this attempt takes up, to record first."""
    asks_people: bool = False
    """The model is offered ``ask_a_person``: a question parks the case until answered."""
    given: GivenAnswer | None = None
    """A person's answer to the question the parked case waits on."""
    start_action: JsonObject | None = None
    """The case's start as the API signed it; ``CASE_STARTED`` carries it."""
    max_event_bytes: int = MAX_EVENT_BYTES
    """The largest event the attempt may emit: a tool result that would make a larger
    one is recorded as a tool error (service/engine/budget.py)."""


class Resume(Enum):
    """Where an attempt begins, read from the record of the attempts before it: the
    engine's resume rules in one place (``resume_point``; the worker's rules for a wait
    a person ended are in ``trail/person_actions.py``)."""

    FRESH = "fresh"
    """Nothing to take up: the loop runs from the first (or the next) cycle."""
    CANCELLED_WHILE_WAITING = "cancelled_while_waiting"
    """Parked for a person and cancelled since: a review kept before the cancel is
    recorded, then the case ends cancelled."""
    ANSWERED = "answered"
    """Parked on the model's question: the person's answer is recorded, the loop goes on."""
    REVIEWED = "reviewed"
    """Parked for review: the review is recorded; it decides the case, or returns it to
    the model, or (an override that takes two persons) parks it again."""
    ANSWER_UNJUDGED = "answer_unjudged"
    """The last attempt recorded an answer and ended before judging it: its checks run
    and the case ends."""


def resume_point(spec: CaseSpec, cancelled: bool) -> Resume:
    """Where ``spec``'s attempt begins (``cancelled``: a cancel is pending)."""
    resumed = spec.resumption
    if resumed is None:
        return Resume.FRESH
    if resumed.parked is not None:
        if cancelled:
            return Resume.CANCELLED_WHILE_WAITING
        return Resume.ANSWERED if resumed.parked.question is not None else Resume.REVIEWED
    if resumed.answer is not None and spec.answering is not None and not cancelled:
        return Resume.ANSWER_UNJUDGED
    return Resume.FRESH


KEEP_OF_TRIMMED_OBSERVATION = 200
"""Characters an observation keeps when it is shortened to fit the context budget."""


def fit_to_budget(
    messages: Sequence[ChatMessage], budget: int | None, total: int | None = None
) -> tuple[list[ChatMessage], list[str]]:
    """Shorten the oldest observations until the conversation fits ``budget`` tokens.

    Deterministic: the same conversation and budget always give the same result.
    Returns the messages to send and the tool call ids whose observations were cut.
    ``total`` is the conversation's token estimate when the caller keeps it.
    """
    if total is None:
        total = sum(count_tokens(message_text(m)) for m in messages)
    if budget is None or total <= budget:
        return list(messages), []
    out = list(messages)
    trimmed: list[str] = []
    for index, message in enumerate(out):
        if total <= budget:
            break
        if isinstance(message, ToolResultMessage) and \
                len(message.content) > KEEP_OF_TRIMMED_OBSERVATION:
            hidden = len(message.content) - KEEP_OF_TRIMMED_OBSERVATION
            short = (f"{message.content[:KEEP_OF_TRIMMED_OBSERVATION]}… [observation shortened "
                     f"to fit the context budget: {hidden} characters not shown]")
            total -= count_tokens(message.content) - count_tokens(short)
            out[index] = replace(message, content=short)
            trimmed.append(message.tool_call_id)
    return out, trimmed


@dataclass
class RunState:
    """The mutable state of one attempt."""

    spec: CaseSpec
    deadline: float
    messages: list[ChatMessage]
    watch: AttemptWatch
    """Whoever watches the engine, told about this attempt (metrics, traces)."""
    seq: int = 0
    cycles: int = 0
    usage: TokenUsage = ZERO_USAGE
    tokens: int = 0
    """Token estimate of ``messages``, kept as they are added."""
    retries: list[ModelRetry] = field(default_factory=list)
    """Model retries of the cycle in progress: on its REACT_CYCLE, or on the terminal
    event when the case ends before the cycle does."""
    deadline_passed: bool = False
    """Set by the attempt's deadline timer (a timer may fire a hair before the deadline's
    clock reading, so this, not ``remaining()``, is what says it fired)."""
    in_flight: asyncio.Future[None] | None = None
    """The last event's publish, until its confirm has been awaited."""
    model_seconds: float | None = None
    """How long the last model turn took (``None`` before the first)."""
    """The attempt's spans, when tracing is on."""
    decided: Callable[[], None] | None = None
    """Told once the attempt's outcome is decided, before its terminal event is sent."""
    specs: Sequence[ToolSpec] = ()
    """What the model is offered: the tools, and the final-answer tool."""
    tool_calls: list[Mapping[str, Any]] = field(default_factory=list)
    """The tool calls the attempts before this one recorded (for the checks)."""
    cycles_sent: list[Event] = field(default_factory=list)
    """This attempt's cycles as sent, when the agent has checks: their tool calls as
    recorded are the events' own wire values, made once for the trail."""
    rejections: int = 0
    returns: int = 0
    """Times a reviewer returned the case to the model."""

    def remaining(self) -> float:
        return self.deadline - asyncio.get_running_loop().time()

    def recorded_calls(self) -> list[Mapping[str, Any]]:
        """Every tool call of the case so far, as recorded (what the checks see), with
        the case's sensitive values themselves, not their placeholders. Read once the
        cycles sent are settled: they are then in the trail, whatever a check does."""
        return self.tool_calls + [call for event in self.cycles_sent
                                  for call in event.wire_values()["payload"]["toolCalls"]]

    def add(self, *messages: ChatMessage) -> None:
        self.messages.extend(messages)
        self.tokens += sum(count_tokens(message_text(m)) for m in messages)


_FENCED_JSON = re.compile(r"```(?:json)?\s*(\{.*?\})\s*```", re.DOTALL)


def extract_answer(text: str) -> JsonObject:
    """The model's answer: its text as a JSON object, or its last fenced JSON object,
    or ``{"answer": text}``."""
    for candidate in [text.strip(), *reversed(_FENCED_JSON.findall(text))]:
        try:
            value = orjson.loads(candidate)
        except orjson.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value
    return {"answer": text}


def system_prompt_digest(prompt: str) -> str:
    return hashlib.sha256(prompt.encode()).hexdigest()


def first_user_message(case_input: JsonObject) -> str:
    return "Case input:\n" + orjson.dumps(case_input, option=orjson.OPT_INDENT_2).decode()
