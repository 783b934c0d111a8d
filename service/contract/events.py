"""The event contract: the JSON that travels on the bus and lands in ``event_log``.

This module does no I/O. The worker (producer) and the event-log consumer both
import it, so what one writes the other reads by construction.

Wire form: UTF-8 JSON, camelCase keys, produced and parsed with orjson and
validated strictly by pydantic. A tool call's duration is a ``timedelta`` in
Python and an integer ``durationMs`` on the wire, wherever it is nested.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Annotated, Any, Literal, Self, TypeAlias, get_args

import orjson
import uuid6
from pydantic import (
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    PrivateAttr,
    TypeAdapter,
    ValidationError,
    model_serializer,
    model_validator,
)
from pydantic.alias_generators import to_camel

from casetrail.contract.integrity import GENESIS, Integrity, Signer, canonical
from casetrail.contract.model_providers import ProviderName

SCHEMA_VERSION: Literal[2] = 2
"""2: canonical (RFC 8785) bodies, ``tenantId``, signed (casetrail.contract.integrity)."""
DEFAULT_TENANT = "default"
"""The tenant of every case until tenants are configured."""
EVENT_ID_NAMESPACE = uuid.UUID("6f1c2d4e-9a57-4c1b-8e3f-2b7a5d0c9e11")

EventType: TypeAlias = Literal[
    "CASE_STARTED",
    "REACT_CYCLE",
    "CASE_COMPLETED",
    "CASE_FAILED",
    "CASE_TIMED_OUT",
    "CASE_CANCELLED",
    "CASE_ERASED",
    "CASE_AWAITING_REVIEW",
    "CASE_REVIEWED",
    "CASE_EXPIRED",
    "CASE_HELD",
    "CASE_RELEASED",
]
"""Every event type, once; the tuples, maps and SQL literals below are derived from it."""
EVENT_TYPES: tuple[EventType, ...] = get_args(EventType)

JsonObject: TypeAlias = dict[str, Any]


class InvalidEvent(ValueError):
    """Raised by :func:`event_from_json` with a message naming the bad field."""


def new_case_id() -> uuid.UUID:
    """A new case's id: a UUIDv7 (RFC 9562), whose first 48 bits are the start's Unix
    time in milliseconds, so that ``event_log``'s partitions by case-id range are
    partitions by month of start (docs/design.md, "A log partitioned for years")."""
    return uuid.UUID(int=uuid6.uuid7().int)


def event_id_for(case_id: uuid.UUID, attempt: int, seq: int) -> uuid.UUID:
    """The deterministic id of the event at ``(case_id, attempt, seq)``:
    ``uuid5(EVENT_ID_NAMESPACE, f"{case_id}:{attempt}:{seq}")``.

    A re-publish of the same event therefore carries the same id and is
    recognised as a duplicate, never stored as a twin.
    """
    return uuid.UUID(int=_event_id_int(case_id, attempt, seq))


_NAMESPACE_BYTES = EVENT_ID_NAMESPACE.bytes
_VERSION_5_CLEAR = ~((0xF000 << 64) | (0xC000 << 48))
_VERSION_5_SET = (5 << 76) | (0x8000 << 48)


def _event_id_int(case_id: uuid.UUID, attempt: int, seq: int) -> int:
    # uuid.uuid5 spelled out (SHA-1 of namespace + name, version and variant bits
    # set), without building the intermediate UUID objects: this runs for every
    # event made and every event read.
    digest = hashlib.sha1(_NAMESPACE_BYTES + f"{case_id}:{attempt}:{seq}".encode()).digest()
    return (int.from_bytes(digest[:16]) & _VERSION_5_CLEAR) | _VERSION_5_SET


def _duration_from_wire(value: object) -> object:
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError("must be an integer number of milliseconds")
    if value < 0:
        raise ValueError("must not be negative")
    return timedelta(milliseconds=value)


def _duration_to_wire(value: timedelta) -> int:
    return round(value / timedelta(milliseconds=1))


Milliseconds = Annotated[
    timedelta,
    BeforeValidator(_duration_from_wire),
    PlainSerializer(_duration_to_wire, return_type=int),
]
"""A ``timedelta`` in Python, an integer count of milliseconds on the wire."""


def _utc_to_wire(value: datetime) -> str:
    # isoformat, not strftime: a third of the time, for every timestamp of every event;
    # the same text ("+00:00", always there for an aware UTC time, becomes "Z").
    if value.tzinfo is not UTC:
        value = value.astimezone(UTC)
    return value.isoformat(timespec="microseconds")[:-6] + "Z"


UtcTimestamp = Annotated[AwareDatetime, PlainSerializer(_utc_to_wire, return_type=str)]
"""An aware datetime, written as ISO 8601 in UTC with microseconds and ``Z``."""


def _numeric(annotation: Any) -> bool:
    return annotation in (int, float) or any(a in (int, float) for a in get_args(annotation))


def refuse_boolean_numbers(model: type[BaseModel], data: Any) -> Any:
    """Lax validation reads ``true`` as the number 1; a number field here refuses it.
    (Called by the bases' ``mode="before"`` validators, so every nested model checks
    its own fields.)"""
    if isinstance(data, dict):
        for name, info in model.model_fields.items():
            key = info.alias or name
            value = data.get(key, data.get(name))
            if isinstance(value, bool) and _numeric(info.annotation):
                raise ValueError(f"{key}: must be a number, not {str(value).lower()}")
    return data


# The serializers that leave out absent optional keys (_omit_*) carry no return
# annotation: pydantic would take one (dict[str, Any]) for the model's schema in
# serialization mode, and the AsyncAPI document would lose the payload's fields.


class ContractModel(BaseModel):
    """Base of every contract type: camelCase on the wire, strict, immutable."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        strict=False,
    )


class TokenUsage(ContractModel):
    """Tokens consumed by one model turn, or summed over a case."""

    input_tokens: int = Field(ge=0, description="Prompt tokens billed by the provider.")
    output_tokens: int = Field(ge=0, description="Completion tokens billed by the provider.")

    def __add__(self, other: TokenUsage) -> TokenUsage:
        return TokenUsage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
        )


ZERO_USAGE = TokenUsage(input_tokens=0, output_tokens=0)


class ToolAttempt(ContractModel):
    """One attempt of a worker tool call on a capability worker."""

    attempt: int = Field(ge=1, description="1 for the first try, 2 for the first retry, ...")
    outcome: Literal["ok", "error", "timeout"] = Field(description="How this attempt ended.")
    duration: Milliseconds = Field(alias="durationMs", description="Time this attempt took.")
    error: str | None = Field(default=None, description="What went wrong, when it did.")
    worker: str | None = Field(default=None, description="Which capability worker answered.")


class McpCallRef(ContractModel):
    """Which MCP server's tool a worker tool call ran, under which argument schema."""

    server: str = Field(description="The operator's name of the MCP server.")
    tool: str = Field(description="The tool's own name on that server.")
    schema_digest: str = Field(description="SHA-256 (hex) of the tool's inputSchema as "
                               "canonical JSON, as offered to the model.")


class A2aCallRef(ContractModel):
    """Which remote A2A agent a worker tool call asked, and the task it answered with."""

    agent: str = Field(description="The operator's name of the remote agent.")
    skill: str | None = Field(default=None, description="The skill asked for, if named.")
    card_digest: str | None = Field(default=None, description="SHA-256 (hex) of the agent's "
                                    "card as RFC 8785 JSON: the card pinned and served.")
    task_id: str | None = Field(default=None, description="The remote task's id.")
    context_id: str | None = Field(default=None, description="The remote task's context id.")
    state: str | None = Field(default=None, description="The state the remote task ended "
                              "in (TASK_STATE_COMPLETED, ...), as the remote agent said.")

    @model_serializer(mode="wrap")
    def _omit_absent(self, handler):  # type: ignore[no-untyped-def]
        data: dict[str, Any] = handler(self)
        return {key: value for key, value in data.items() if value is not None}


class ToolCallRecord(ContractModel):
    """One tool call of a cycle: what was asked, what came back, from where, how long.

    A failed call has ``error`` set and no ``toolResult``: nothing is invented.
    """

    tool_name: str = Field(description="The tool the model asked for.")
    tool_args: JsonObject = Field(description="The arguments as the model gave them.")
    tool_result: Any = Field(default=None, description="The tool's result; absent on error.")
    tool_source: Literal["worker", "local"] = Field(
        description="'worker' for a WorkerTool run on a capability worker, 'local' in process."
    )
    duration: Milliseconds = Field(
        alias="durationMs", description="Wall time of the whole call, retries included."
    )
    tool_call_id: str | None = Field(default=None, description="The model's id for this call.")
    error: str | None = Field(default=None, description="Why the call failed; absent on success.")
    raw_args: str | None = Field(
        default=None, description="The arguments text, kept when it was not a JSON object."
    )
    attempts: tuple[ToolAttempt, ...] = Field(
        default=(), description="Each attempt of a worker tool call, in order."
    )
    mcp: McpCallRef | None = Field(
        default=None, description="For a tool of an MCP server: the server, the tool and "
        "its schema's digest (toolSource stays 'worker')."
    )
    a2a: A2aCallRef | None = Field(
        default=None, alias="a2a", description="For a remote A2A agent's tool: the agent, "
        "its pinned card's digest and the remote task (id, context, final state); the "
        "result is the task's artifacts (toolSource stays 'worker')."
    )

    @model_validator(mode="after")
    def _error_excludes_result(self) -> ToolCallRecord:
        if self.error is not None and self.tool_result is not None:
            raise ValueError("a failed tool call carries an error and no toolResult")
        return self

    @model_serializer(mode="wrap")
    def _omit_absent(self, handler):  # type: ignore[no-untyped-def]
        data: dict[str, Any] = handler(self)
        # Optional keys appear only when they carry something, so the seed's
        # example round-trips key for key; a successful call whose result is
        # JSON null still says so explicitly.
        for key in ("toolCallId", "tool_call_id", "rawArgs", "raw_args", "mcp", "a2a"):
            if data.get(key) is None:
                data.pop(key, None)
        for key in ("attempts",):
            if not data.get(key):
                data.pop(key, None)
        error_key = "error"
        if data.get(error_key) is None:
            data.pop(error_key, None)
        else:
            data.pop("toolResult", None)
            data.pop("tool_result", None)
        return data


class ModelRetry(ContractModel):
    """A retried model request inside one cycle: when, why, how long it waited."""

    at: UtcTimestamp
    reason: str
    waited: Milliseconds = Field(alias="waitedMs")


class AnswerRejection(ContractModel):
    """An answer that did not stand: what the model gave (the final-answer call's
    arguments, or its text when it answered in prose) and why it was refused; the model
    was told and asked again."""

    answer: Any
    errors: tuple[str, ...] = Field(min_length=1)
    tool_call_id: str | None = Field(default=None, description="The final-answer call's id "
                                     "(absent: the model answered in prose, no call).")

    @model_serializer(mode="wrap")
    def _omit_absent(self, handler):  # type: ignore[no-untyped-def]
        data: dict[str, Any] = handler(self)
        if data.get("toolCallId") is None:
            data.pop("toolCallId", None)
        return data


class CheckResult(ContractModel):
    """One of the agent's checks over the case's input, tool calls and answer, run
    before its outcome."""

    name: str
    version: str
    passed: bool
    blocking: bool = Field(description="A failed blocking check never lets the answer "
                                       "stand as an automated decision.")
    detail: str


class ReactCyclePayload(ContractModel):
    """One ReAct cycle: the model's reasoning, the tools it called, the tokens it used."""

    cycle_index: int = Field(ge=0, description="0 for the first cycle of the attempt.")
    reasoning_text: str = Field(description="The model's text for this turn.")
    tool_calls: tuple[ToolCallRecord, ...] = Field(description="In the order the model asked.")
    token_usage: TokenUsage = Field(description="Tokens of this turn.")
    model: str | None = Field(default=None, description="The model that produced the turn.")
    finish_reason: str | None = Field(default=None, description="Why the model stopped.")
    model_retries: tuple[ModelRetry, ...] = Field(
        default=(), description="Transient provider failures retried within this cycle."
    )
    trimmed_observations: tuple[str, ...] = Field(
        default=(), description="Tool call ids whose observations were shortened for this turn."
    )
    answer: JsonObject | None = Field(default=None, description="The final answer given in "
                                      "this turn, as validated against the agent's schema.")
    answer_rejected: AnswerRejection | None = Field(
        default=None, description="A final answer given in this turn and refused.")

    @model_serializer(mode="wrap")
    def _omit_absent(self, handler):  # type: ignore[no-untyped-def]
        data: dict[str, Any] = handler(self)
        for key in ("model", "finishReason", "answer", "answerRejected"):
            if data.get(key) is None:
                data.pop(key, None)
        for key in ("modelRetries", "trimmedObservations"):
            if not data.get(key):
                data.pop(key, None)
        return data


class ModelRef(ContractModel):
    """Which chat model runs a case."""

    provider: ProviderName
    name: str = Field(min_length=1, max_length=200)
    endpoint: str | None = Field(
        default=None, pattern=r"^[a-z0-9][a-z0-9_.-]{0,63}$",
        description="A model endpoint the operator configured (CASETRAIL_MODEL_ENDPOINTS).")
    base_url: str | None = Field(
        default=None, max_length=2000,
        description="Accepted only when it is a configured endpoint's baseUrl.")
    latency_ms: int | None = Field(
        default=None, ge=0, le=60_000,
        description="Scripted models only: how long each turn takes, to simulate a real model.",
    )

    # Checked here, not in ContractModel: events are validated on the consumer's
    # hot path, and only what a client sends needs it.
    @model_validator(mode="before")
    @classmethod
    def _no_boolean_numbers(cls, data: Any) -> Any:
        return refuse_boolean_numbers(cls, data)


class Limits(ContractModel):
    """Limits of one case; reaching one ends the case with its own terminal event."""

    max_cycles: int = Field(ge=1, description="Model turns allowed in one attempt.")
    deadline_seconds: float = Field(gt=0, description="Hard wall-clock limit of one attempt.")
    max_answer_retries: int | None = Field(
        default=None, ge=0, le=10, description="Answers refused (not valid for the agent's "
        "answer schema) before the case fails with invalid_answer; absent: 2.")

    @model_serializer(mode="wrap")
    def _omit_absent(self, handler):  # type: ignore[no-untyped-def]
        data: dict[str, Any] = handler(self)
        if data.get("maxAnswerRetries") is None:
            data.pop("maxAnswerRetries", None)
        return data


class ToolOffer(ContractModel):
    """A tool offered to the model at the start of a case."""

    name: str
    source: Literal["worker", "local"]
    description: str
    input_schema_digest: str = Field(
        description="SHA-256 (hex) of the RFC 8785 canonical JSON of the tool's argument "
                    "schema: two runs offered the same tool only if these agree.")


class McpCatalogRead(ContractModel):
    """One MCP server's catalog as a case was offered it: how old it was, whether it was
    stale (the server was down: its last catalog was offered), why, and the tools the
    agent names that it did not hold (not offered)."""

    server: str
    read_at: datetime | None = Field(default=None, description="When the server's tools "
                                     "were listed; absent when they never were.")
    age_seconds: float | None = Field(default=None, ge=0, description="The catalog's age "
                                      "when the case started.")
    stale: bool = Field(default=False, description="The server could not be read: its last "
                        "catalog (if any) was offered, and its calls fail until it answers.")
    problem: str | None = Field(default=None, description="Why it could not be read.")
    not_served: tuple[str, ...] = Field(default=(), description="Tools the agent names that "
                                        "the catalog lacks: not offered.")

    @model_serializer(mode="wrap")
    def _omit_absent(self, handler):  # type: ignore[no-untyped-def]
        data: dict[str, Any] = handler(self)
        for key in ("readAt", "read_at", "ageSeconds", "age_seconds", "problem"):
            if data.get(key) is None:
                data.pop(key, None)
        for key in ("notServed", "not_served"):
            if not data.get(key, True):
                data.pop(key, None)
        return data


class TraceRef(ContractModel):
    """Where an attempt's spans are: its ``invoke_agent`` span in OpenTelemetry (W3C ids,
    lowercase hex), so a trail links to its trace."""

    trace_id: str = Field(pattern=r"^[0-9a-f]{32}$")
    span_id: str = Field(pattern=r"^[0-9a-f]{16}$")


class ResumedFrom(ContractModel):
    """Where an attempt took up a case a dead worker left: the attempt it resumed, that
    attempt's last stored seq, and how many recorded cycles it carried over."""

    attempt: int = Field(ge=1)
    seq: int = Field(ge=0)
    cycles: int = Field(ge=0, description="Recorded cycles not run again; this attempt's "
                        "cycleIndex continues from here.")


class SignedPersonAction(ContractModel):
    """A person's action as the API signed it: the object (digests of its free text,
    never the text), the action key's id and the Ed25519 signature over
    ``casetrail/person-action/v1\n`` followed by the object's RFC 8785 bytes."""

    signed: JsonObject
    key_id: str = Field(pattern=r"^[0-9a-f]{16}$")
    sig: str = Field(pattern=r"^[A-Za-z0-9_-]+$")


class CaseStartedPayload(ContractModel):
    """The first event of every attempt: who runs the case, with what, on what input."""

    agent: str
    agent_version: str = Field(description="The agent profile's version.")
    casetrail_version: str = Field(description="The casetrail release that ran the attempt.")
    model: ModelRef
    system_prompt_digest: str = Field(description="sha256 of the system prompt, hex.")
    tools_offered: tuple[ToolOffer, ...]
    agent_digest: str | None = Field(
        default=None, description="SHA-256 (hex) of the RFC 8785 canonical JSON of what "
        "defines the agent: its instructions, its tools' schemas, its answer schema and its "
        "checks' names and versions (two cases ran the same agent only if these agree).")
    answer_schema_digest: str | None = Field(
        default=None, description="SHA-256 (hex) of the RFC 8785 canonical JSON of the "
        "agent's answer schema, which the final answer was validated against.")
    limits: Limits
    input: JsonObject
    restart_reason: str | None = Field(
        default=None, description="On attempt 2+, why the case started again."
    )
    started_by: str | None = Field(
        default=None, description="Who started the case: ``key:<keyId>`` of the API key.")
    trace: TraceRef | None = Field(
        default=None, description="The attempt's trace, when traces are exported and this "
        "case was sampled; absent otherwise.")
    resumed_from: ResumedFrom | None = Field(
        default=None, description="On an attempt that resumed the recorded cycles of an "
        "earlier one; absent when the attempt started from the beginning.")
    start_action: SignedPersonAction | None = Field(
        default=None, description="The case's start as the API signed it with its action "
        "key (docs/bundle.md, \"A person's action\"); absent on cases accepted before "
        "starts were signed.")
    mcp_catalogs: tuple[McpCatalogRead, ...] | None = Field(
        default=None, description="Each MCP server whose tools the agent names: the "
        "catalog the case was offered; absent when it names none.")

    @model_serializer(mode="wrap")
    def _omit_absent(self, handler):  # type: ignore[no-untyped-def]
        data: dict[str, Any] = handler(self)
        for key in ("trace", "resumedFrom", "resumed_from", "answerSchemaDigest",
                    "agentDigest", "startAction", "mcpCatalogs", "mcp_catalogs"):
            if data.get(key) is None:
                data.pop(key, None)
        return data


class CaseTotals(ContractModel):
    """What every terminal event carries: cycles completed and tokens so far."""

    cycles_completed: int = Field(ge=0)
    token_totals: TokenUsage


class CaseCompletedPayload(CaseTotals):
    """The case ended with an answer."""

    answer: JsonObject
    checks: tuple[CheckResult, ...] = Field(default=(), description="The agent's checks, "
                                            "run on the answer before this event.")
    decided_by: Literal["agent", "reviewer"] | None = Field(
        default=None, description="Whose decision ``answer`` is: the agent's, standing on its "
        "own, or a reviewer's (who confirmed or overrode the agent's; CASE_REVIEWED says "
        "who). Absent on trails recorded before review existed.")

    @model_serializer(mode="wrap")
    def _omit_absent(self, handler):  # type: ignore[no-untyped-def]
        data: dict[str, Any] = handler(self)
        if not data.get("checks"):
            data.pop("checks", None)
        if data.get("decidedBy") is None:
            data.pop("decidedBy", None)
        return data


ReviewReason = Literal["decision", "failed_check", "tenant_policy", "question",
                       "second_review"]
"""Why a case waits for a person: its agent sends this decision to review, a blocking
check failed, its tenant reviews every case, the model asked a person a question, or a
reviewer's override waits for a second person (the tenant's four-eyes rule; the waiting
answer is the override)."""


class PendingQuestion(ContractModel):
    """A question the model asked a person mid-case, with the rest of its turn: a
    ``REACT_CYCLE`` is emitted only after its tool results, so the turn waits here, and
    once a person has answered, the next attempt records it in full (the question's
    result saying who answered)."""

    call_id: str = Field(description="The question's tool call id.")
    question: str
    question_index: int = Field(ge=0, description="Where among the turn's calls the model "
                                "asked it.")
    reasoning_text: str
    tool_calls: tuple[ToolCallRecord, ...] = Field(
        description="The turn's other calls, run, with their results.")
    token_usage: TokenUsage
    model: str | None = None
    finish_reason: str | None = None
    model_retries: tuple[ModelRetry, ...] = ()

    @model_serializer(mode="wrap")
    def _omit_absent(self, handler):  # type: ignore[no-untyped-def]
        data: dict[str, Any] = handler(self)
        for key in ("model", "finishReason"):
            if data.get(key) is None:
                data.pop(key, None)
        if not data.get("modelRetries"):
            data.pop("modelRetries", None)
        return data


class CaseAwaitingReviewPayload(CaseTotals):
    """Not terminal: a person acts next, on the agent's answer (a review) or on the
    model's question (an answer). The attempt ends here; the case holds no worker until
    a person acts (then the next attempt takes it up from the record)."""

    answer: JsonObject | None = Field(default=None, description="The agent's answer, as "
                                      "validated (absent when the model asked a question).")
    checks: tuple[CheckResult, ...] = Field(default=(), description="The agent's checks.")
    review_reasons: tuple[ReviewReason, ...] = Field(
        min_length=1, description="Why a person decides: decision, failed_check, "
        "tenant_policy, question, second_review (a reviewer's override, the answer here, "
        "waits for a second person).")
    question: PendingQuestion | None = Field(
        default=None, description="The model's question to a person, and its turn.")

    @model_serializer(mode="wrap")
    def _omit_absent(self, handler):  # type: ignore[no-untyped-def]
        data: dict[str, Any] = handler(self)
        if not data.get("checks"):
            data.pop("checks", None)
        for key in ("answer", "question"):
            if data.get(key) is None:
                data.pop(key, None)
        return data


class Reviewer(ContractModel):
    """A person as authenticated: the OIDC subject, or the person an API key was made
    for. Never an email: events cannot be erased."""

    subject: str = Field(min_length=1, max_length=200, description="The person.")
    via: Literal["oidc", "key"]
    key_id: str | None = Field(default=None, description="The API key used, when via key.")
    name: str | None = Field(default=None, description="The key's name, when it has one.")

    @model_serializer(mode="wrap")
    def _omit_absent(self, handler):  # type: ignore[no-untyped-def]
        data: dict[str, Any] = handler(self)
        for key in ("keyId", "name"):
            if data.get(key) is None:
                data.pop(key, None)
        return data


Verdict = Literal["confirm", "override", "return"]


class CaseReviewedPayload(ContractModel):
    """A person's review of a case awaiting one, recorded by the worker from the review
    the API kept: confirm the agent's decision, override it, or return the case to the
    model with a note."""

    reviewer: Reviewer
    verdict: Verdict
    decision: JsonObject | None = Field(
        default=None, description="The reviewer's decision (override), valid for the "
        "agent's answer schema.")
    reason: str = Field(min_length=1, description="Why, in the reviewer's words.")
    reviewed_at: UtcTimestamp
    action: SignedPersonAction | None = Field(
        default=None, description="What the API signed with its action key when it kept "
        "the review (docs/bundle.md, \"A person's action\"); absent on reviews recorded "
        "before actions were signed.")

    @model_serializer(mode="wrap")
    def _omit_absent(self, handler):  # type: ignore[no-untyped-def]
        data: dict[str, Any] = handler(self)
        for key in ("decision", "action"):
            if data.get(key) is None:
                data.pop(key, None)
        return data


class _WithRetries(CaseTotals):
    model_retries: tuple[ModelRetry, ...] = Field(
        default=(), description="Model retries of the cycle that never completed."
    )

    @model_serializer(mode="wrap")
    def _omit_absent(self, handler):  # type: ignore[no-untyped-def]
        data: dict[str, Any] = handler(self)
        for key in ("modelRetries", "checks"):
            if not data.get(key):
                data.pop(key, None)
        return data


class CaseFailedPayload(_WithRetries):
    """The case ended without an answer; ``reason_code`` says which way."""

    reason_code: Literal["max_cycles", "model_error", "internal_error", "publish_error",
                         "invalid_answer", "policy_check_failed"]
    message: str
    checks: tuple[CheckResult, ...] = Field(default=(), description="The agent's checks, when "
                                            "a blocking one refused the answer.")


class CaseTimedOutPayload(_WithRetries):
    """The attempt's hard deadline passed; in-flight calls were abandoned."""

    deadline_seconds: float
    message: str


class CaseCancelledPayload(CaseTotals):
    """Somebody asked the case to stop."""

    while_queued: bool = Field(description="True when the case never started running.")
    reason: str | None = None
    cancelled_by: str | None = Field(
        default=None, description="Who asked the case to stop: ``key:<keyId>``.")


class CaseErasedPayload(ContractModel):
    """Administrative, after the terminal event: the case's sensitive values were
    destroyed (their key shredded); the placeholders in its trail stand for nothing
    anyone can recover."""

    erased_by: str = Field(description="Who erased them: ``key:<keyId>``, ``oidc:<sub>``, "
                           "``operator``, or ``retention:policy-<id>-v<n>``.")
    erased_at: UtcTimestamp
    placeholders: tuple[str, ...] = Field(description="The placeholders that were erased.")
    action: SignedPersonAction | None = Field(
        default=None, description="What the API signed with its action key when the person "
        "asked (docs/bundle.md, \"A person's action\"); absent on a policy's erasure and on "
        "erasures recorded before erasures were signed. The database shreds the values "
        "when this event is stored, never before.")

    @model_serializer(mode="wrap")
    def _omit_absent(self, handler):  # type: ignore[no-untyped-def]
        data: dict[str, Any] = handler(self)
        if data.get("action") is None:
            data.pop("action", None)
        return data


class ChainHead(ContractModel):
    """An attempt's last event before expiry: where its hash chain ended."""

    attempt: int = Field(ge=1)
    seq: int = Field(ge=0)
    event_id: uuid.UUID
    hash: str = Field(pattern=r"^[0-9a-f]{64}$")


class ArchivedBundle(ContractModel):
    """A case's bundle in the archive (docs/bundle.md, "Archives")."""

    file: str = Field(description="Relative to the archive: "
                      "``bundles/<tenant>/<case id>-<sha256 prefix>.json``.")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="The file's SHA-256.")
    manifest: str = Field(description="The signed manifest that lists it.")


class CaseExpiredPayload(ContractModel):
    """Administrative, after the terminal event: the case's time under its retention
    policy is up and no hold keeps it, so its other events are deleted. What stays is
    this event (and its tombstone): enough to check every leaf the log holds of the
    case against it."""

    policy_id: int = Field(ge=1, description="The retention policy in force.")
    policy_version: int = Field(ge=1)
    kept_days: int = Field(ge=1, description="How long the policy keeps a case.")
    counted_from: Literal["ended", "business_date"]
    events_removed: int = Field(ge=1, description="Events deleted: every event of the "
                                "case before this one.")
    heads: tuple[ChainHead, ...] = Field(min_length=1, description="Each attempt's final "
                                         "chain hash (this event chains on the last).")
    expired_by: str = Field(description="What ran the expiry: ``retention:<worker>``.")
    archive: ArchivedBundle | None = Field(default=None, description=(
        "Where the case's bundle was archived before its events went (a policy that "
        "archives): absent when the policy does not."))


class CaseHeldPayload(ContractModel):
    """Administrative, after the terminal event: a legal hold keeps the case (it is
    neither expired nor erased while the hold lasts). Recorded once per hold."""

    hold_id: uuid.UUID
    scope: Literal["case", "business_key", "tenant"] = Field(description=(
        "What the hold names: this case, a business key it has, or its whole tenant."))
    reason: str
    placed_by: str = Field(description="The person who placed it.")
    placed_at: UtcTimestamp
    ends_at: UtcTimestamp | None = Field(default=None, description="When it ends by itself.")


class CaseReleasedPayload(ContractModel):
    """Administrative: a hold recorded by ``CASE_HELD`` no longer keeps the case."""

    hold_id: uuid.UUID
    released_by: tuple[str, ...] = Field(description="The two persons who released it; "
                                         "empty when it ended at its end time.")
    ended_at: UtcTimestamp


class EventBase(ContractModel):
    """The envelope every event shares."""

    event_id: uuid.UUID
    case_id: uuid.UUID
    tenant_id: str = Field(default=DEFAULT_TENANT, pattern=r"^[a-z0-9][a-z0-9-]{0,39}$",
                           description="The tenant the case belongs to.")
    attempt: int = Field(ge=1, description="Run of the case: 1, then 2 after a worker died.")
    seq: int = Field(ge=0, description="0, 1, 2, ... within an attempt, without gaps.")
    event_type: EventType
    occurred_at: UtcTimestamp
    schema_version: Literal[2] = SCHEMA_VERSION
    _wire: dict[str, Any] | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _event_id_is_derived(self) -> EventBase:
        if self.event_id.int != _event_id_int(self.case_id, self.attempt, self.seq):
            raise ValueError("eventId is not derived from (caseId, attempt, seq)")
        return self

    def to_json(self) -> bytes:
        """The wire form, the bytes that are hashed and signed: the envelope as RFC 8785
        canonical JSON in UTF-8 (``integrity`` travels beside it)."""
        return canonical(self.wire_values())

    def wire_values(self) -> dict[str, Any]:
        """The envelope as JSON values, the wire form before it is made canonical: made
        once (the event is immutable), so whoever else reads the sent event's values (the
        checks read its tool calls) costs nothing more. Not to be changed by a reader."""
        # Kept in the private attributes' dict, read and written directly: pydantic's
        # attribute access to a private attribute costs microseconds each time.
        private: dict[str, Any] = self.__pydantic_private__  # type: ignore[assignment]
        wire: dict[str, Any] | None = private["_wire"]
        if wire is None:
            wire = private["_wire"] = self.model_dump(mode="json", by_alias=True)
        return wire

    def __eq__(self, other: object) -> bool:
        """Events are equal when their fields are (the values made for the wire aside)."""
        if not isinstance(other, EventBase):
            return NotImplemented
        return type(self) is type(other) and self.__dict__ == other.__dict__

    def __hash__(self) -> int:
        return super().__hash__()

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False
                   ) -> Self:
        copy = super().model_copy(update=update, deep=deep)
        copy.__pydantic_private__["_wire"] = None  # type: ignore[index]  # its own values
        return copy

    @property
    def routing_key(self) -> str:
        """``case.<tenantId>.<caseId>.<EVENT_TYPE>`` on the events exchange."""
        return f"case.{self.tenant_id}.{self.case_id}.{self.event_type}"

    @property
    def is_terminal(self) -> bool:
        return self.event_type in TERMINAL_EVENT_TYPES


class CaseStarted(EventBase):
    event_type: Literal["CASE_STARTED"] = "CASE_STARTED"
    payload: CaseStartedPayload


class ReactCycle(EventBase):
    event_type: Literal["REACT_CYCLE"] = "REACT_CYCLE"
    payload: ReactCyclePayload


class CaseCompleted(EventBase):
    event_type: Literal["CASE_COMPLETED"] = "CASE_COMPLETED"
    payload: CaseCompletedPayload


class CaseFailed(EventBase):
    event_type: Literal["CASE_FAILED"] = "CASE_FAILED"
    payload: CaseFailedPayload


class CaseTimedOut(EventBase):
    event_type: Literal["CASE_TIMED_OUT"] = "CASE_TIMED_OUT"
    payload: CaseTimedOutPayload


class CaseCancelled(EventBase):
    event_type: Literal["CASE_CANCELLED"] = "CASE_CANCELLED"
    payload: CaseCancelledPayload


class CaseErased(EventBase):
    event_type: Literal["CASE_ERASED"] = "CASE_ERASED"
    payload: CaseErasedPayload


class CaseExpired(EventBase):
    event_type: Literal["CASE_EXPIRED"] = "CASE_EXPIRED"
    payload: CaseExpiredPayload


class CaseHeld(EventBase):
    event_type: Literal["CASE_HELD"] = "CASE_HELD"
    payload: CaseHeldPayload


class CaseReleased(EventBase):
    event_type: Literal["CASE_RELEASED"] = "CASE_RELEASED"
    payload: CaseReleasedPayload


class CaseAwaitingReview(EventBase):
    event_type: Literal["CASE_AWAITING_REVIEW"] = "CASE_AWAITING_REVIEW"
    payload: CaseAwaitingReviewPayload


class CaseReviewed(EventBase):
    event_type: Literal["CASE_REVIEWED"] = "CASE_REVIEWED"
    payload: CaseReviewedPayload


Event: TypeAlias = Annotated[
    CaseStarted | ReactCycle | CaseCompleted | CaseFailed | CaseTimedOut | CaseCancelled
    | CaseErased | CaseAwaitingReview | CaseReviewed | CaseExpired | CaseHeld | CaseReleased,
    Field(discriminator="event_type"),
]
TerminalEvent: TypeAlias = CaseCompleted | CaseFailed | CaseTimedOut | CaseCancelled
TerminalPayload: TypeAlias = (
    CaseCompletedPayload | CaseFailedPayload | CaseTimedOutPayload | CaseCancelledPayload
)
Payload: TypeAlias = (CaseStartedPayload | ReactCyclePayload | TerminalPayload
                      | CaseErasedPayload | CaseAwaitingReviewPayload | CaseReviewedPayload
                      | CaseExpiredPayload | CaseHeldPayload | CaseReleasedPayload)

_EVENT_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)
_EVENT_CLASSES: dict[str, type[EventBase]] = {
    cls.model_fields["event_type"].default: cls
    for cls in get_args(get_args(Event)[0])
}
_PAYLOAD_EVENT: dict[type[ContractModel], type[EventBase]] = {
    cls.model_fields["payload"].annotation: cls  # type: ignore[misc]
    for cls in _EVENT_CLASSES.values()
}


def event_class(event_type: str) -> type[EventBase]:
    """The envelope model of ``event_type``."""
    return _EVENT_CLASSES[event_type]


TERMINAL_EVENT_TYPES: frozenset[str] = frozenset(
    cls.model_fields["event_type"].default for cls in get_args(TerminalEvent)
)
assert set(_EVENT_CLASSES) == set(EVENT_TYPES), "an event type without its class, or one more"
ADMINISTRATIVE_EVENT_TYPES: frozenset[str] = frozenset(
    cls.model_fields["event_type"].default
    for cls in (CaseErased, CaseExpired, CaseHeld, CaseReleased))
"""Events after the terminal one (the completeness rule ignores them)."""
PARKING_EVENT_TYPE = CaseAwaitingReview.model_fields["event_type"].default
"""The event that ends an attempt without ending the case: it waits for a person."""
EXPIRED_EVENT_TYPE = CaseExpired.model_fields["event_type"].default
"""The event that closes an expired case: only it and its tombstone remain."""
RUNNING_EVENT_TYPES = ("CASE_STARTED", "REACT_CYCLE", "CASE_REVIEWED")
"""The events that show a case at work (its status ``running``, until it ends or waits)."""


class CaseStatus(StrEnum):
    """A case's status (``cases.status``, the ``status`` of ``GET /cases/{id}``): one
    word everywhere, the same spelling in Python, in the SQL the code builds, in the
    viewer (served by ``GET /ui/assets/vocabulary.json``) and in migration 001's CHECK
    (tests/unit/test_events.py compares them)."""

    QUEUED = "queued"
    RUNNING = "running"
    AWAITING_REVIEW = "awaiting_review"
    COMPLETED = "completed"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"


def status_for(event_type: str) -> CaseStatus | None:
    """The status a terminal event gives its case (``CASE_TIMED_OUT`` → ``timed_out``);
    ``None`` for any other event type."""
    return _ENDED_BY.get(event_type)


_ENDED_BY: dict[str, CaseStatus] = {
    t: CaseStatus(t.removeprefix("CASE_").lower()) for t in TERMINAL_EVENT_TYPES}
ENDED_STATUSES: frozenset[CaseStatus] = frozenset(_ENDED_BY.values())
"""The ``cases.status`` of an ended case: one per terminal event type."""


def sql_statuses(statuses: Iterable[CaseStatus]) -> str:
    """``'a', 'b'``: statuses as SQL string literals (for the SQL the code builds)."""
    return ", ".join(f"'{CaseStatus(s).value}'" for s in sorted(statuses))


ENDED_SQL = sql_statuses(ENDED_STATUSES)
"""The ended statuses as SQL literals (``status IN (...)``)."""
ACTIVE_SQL = sql_statuses((CaseStatus.QUEUED, CaseStatus.RUNNING))
"""A case queued or running, as SQL literals."""


MAX_EVENT_BYTES = 1_048_576
"""Events larger than this are refused by the consumer, and never produced: the worker
records a tool result that would make one as a tool error (service/engine/budget.py)."""


_ENVELOPE_FIELDS = frozenset(EventBase.model_fields) | {"payload"}


def make_event(
    case_id: uuid.UUID,
    attempt: int,
    seq: int,
    payload: Payload,
    occurred_at: datetime | None = None,
    tenant_id: str = DEFAULT_TENANT,
) -> Event:
    """Build the envelope around ``payload``; the event type follows from the payload's type."""
    if attempt < 1 or seq < 0:
        raise ValueError(f"attempt must be >= 1 and seq >= 0, not {attempt} and {seq}")
    cls = _PAYLOAD_EVENT[type(payload)]
    # The payload is already a validated model and the envelope fields are derived
    # here, so the envelope is assembled without a second validation pass (this runs
    # once per cycle); ``event_from_json`` validates everything that is read. Given by
    # their aliases with every field set, model_construct takes each at its first look
    # (half its time by field name).
    values: dict[str, Any] = {
        "eventId": event_id_for(case_id, attempt, seq), "caseId": case_id,
        "tenantId": tenant_id, "attempt": attempt, "seq": seq,
        "eventType": cls.model_fields["event_type"].default,
        "occurredAt": occurred_at or datetime.now(UTC), "schemaVersion": SCHEMA_VERSION,
        "payload": payload}
    event = cls.model_construct(set(_ENVELOPE_FIELDS), **values)
    return event  # type: ignore[return-value]


def cancelled_while_queued(case_id: uuid.UUID, reason: str | None,
                           by: str | None = None, tenant_id: str = DEFAULT_TENANT
                           ) -> Sequence[Event]:
    """The whole trail of a case cancelled before any worker ran it."""
    return [
        make_event(
            case_id, 1, 0,
            CaseCancelledPayload(
                cycles_completed=0, token_totals=ZERO_USAGE, while_queued=True, reason=reason,
                cancelled_by=by,
            ),
            tenant_id=tenant_id,
        )
    ]


def describe_validation_error(error: ValidationError, root: str = "(root)") -> str:
    """``field: reason`` for every problem, joined: what a person or a model can act on."""
    parts = []
    for item in error.errors(include_url=False):
        location = ".".join(str(p) for p in item["loc"]) or root
        parts.append(f"{location}: {item['msg']}")
    return "; ".join(parts)


def event_from_json(data: bytes) -> Event:
    """Parse and strictly validate one event; :class:`InvalidEvent` names what is wrong."""
    return event_and_payload_from_json(data)[0]


def event_and_payload_from_json(data: bytes) -> tuple[Event, str]:
    """Like :func:`event_from_json`, also returning the validated payload as JSON text
    (what ``event_log.payload`` stores), without serializing the model again."""
    if len(data) > MAX_EVENT_BYTES:
        raise InvalidEvent(f"body of {len(data)} bytes exceeds the {MAX_EVENT_BYTES} byte limit")
    try:
        raw = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise InvalidEvent(f"not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise InvalidEvent("the event must be a JSON object")
    version = raw.get("schemaVersion")
    if version != SCHEMA_VERSION:
        older = isinstance(version, int) and version < SCHEMA_VERSION
        raise InvalidEvent(f"schemaVersion: {version!r} is {'older than' if older else 'not'} "
                           f"the current version {SCHEMA_VERSION}"
                           f"{' (unsigned events are refused)' if older else ''}")
    event_type = raw.get("eventType")
    if event_type not in _EVENT_CLASSES:
        raise InvalidEvent(f"eventType: unknown event type {event_type!r}")
    try:
        event = _EVENT_ADAPTER.validate_python(raw)
    except ValidationError as exc:
        raise InvalidEvent(describe_validation_error(exc)) from None
    return event, orjson.dumps(raw["payload"]).decode()


@dataclass(frozen=True, slots=True)
class SignedEvent:
    """An event with the exact bytes that were signed and their integrity, as the
    consumer admits it and the event log stores it."""

    event: Event
    body: bytes
    integrity: Integrity
    payload: str
    """The payload as JSON text (what ``event_log.payload`` stores)."""

    @classmethod
    def seal(cls, event: Event, signer: Signer, prev_hash: str) -> SignedEvent:
        """Sign ``event`` after ``prev_hash`` (tests, benchmarks and the worker's sink)."""
        body = event.to_json()
        return cls(event, body, signer.seal(prev_hash, body),
                   event_payload_json(event).decode())


def seal_chain(events: Sequence[Event], signer: Signer) -> list[SignedEvent]:
    """One attempt's events, in seq order, chained and signed as the worker does."""
    sealed: list[SignedEvent] = []
    prev_hash = GENESIS
    for event in events:
        sealed.append(SignedEvent.seal(event, signer, prev_hash))
        prev_hash = sealed[-1].integrity.hash
    return sealed


def event_payload_json(event: Event) -> bytes:
    """The payload alone, as stored in ``event_log.payload``."""
    return orjson.dumps(event.payload.model_dump(mode="json", by_alias=True))
