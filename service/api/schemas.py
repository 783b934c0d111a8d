"""The API's request bodies (responses are built as plain JSON in the routes)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from casetrail.cases.requests import (
    AnswerRequest,
    CancelRequest,
    CaseRequest,
    LimitsRequest,
    ReviewRequest,
)

# the bodies, described here too
__all__ = ["AnswerRequest", "CancelRequest", "CaseRequest", "LimitsRequest", "ReviewRequest"]


# Responses: the routes write their JSON directly (orjson); these models only
# describe it in the OpenAPI document, and the contract test checks every
# response against them.


class Problem(BaseModel):
    """An error as RFC 9457 problem details (``application/problem+json``): what went
    wrong, in words."""

    type: str = Field(default="about:blank", description="No problem type beyond the "
                      "status: `about:blank`.")
    title: str = Field(description="The status's phrase, e.g. Not Found.")
    status: int = Field(ge=400, le=599)
    detail: str = Field(description="What went wrong with this request, in words.")


class Issue(BaseModel):
    """One problem with a request: where (``loc``) and why (``msg``)."""

    model_config = ConfigDict(extra="allow")

    loc: list[str | int]
    msg: str
    type: str


class ValidationProblem(Problem):
    """The request was understood but refused: each field and the reason."""

    errors: list[Issue]


class CaseLinks(BaseModel):
    self: str
    events: str


class CaseAccepted(BaseModel):
    """A case recorded and its start command confirmed by the broker."""

    caseId: str
    status: str
    agent: str
    limits: dict[str, Any]
    model: dict[str, Any]
    links: CaseLinks


class TokenTotals(BaseModel):
    inputTokens: int
    outputTokens: int


class IntegritySummary(BaseModel):
    """Whether the case's trail verifies (GET /cases/{caseId}/verify has the details)."""

    verified: bool
    complete: bool
    checkedAt: str
    problems: list[str] | None = Field(
        default=None, description="When it does not verify, the problems' codes; "
        "`projection_mismatch`: a value the case shows (status, answer, outcome, totals) "
        "is not what its signed trail says, and is not to be relied on.")


class SensitiveSummary(BaseModel):
    """The case's sensitive input values: where they stand, whether shown in clear."""

    placeholders: list[str] = Field(description="What stands in the input and the trail "
                                                "for each value, e.g. `[pii:applicantName]`.")
    shownInClear: bool = Field(description="True when this response carries the values "
                                           "(the caller has `pii:read`; the read is logged).")
    erasedAt: str | None
    erasedBy: str | None


class EraseAccepted(BaseModel):
    caseId: str
    status: str = Field(description="`erased` (its CASE_ERASED stored, the values gone), "
                        "`already erased`, or `erasing` (sent: the values go when the "
                        "worker's CASE_ERASED is stored, seconds later).")
    erasedAt: str | None


class CaseView(BaseModel):
    """A case's status, totals and answer, and whether its trail verifies."""

    caseId: str
    agent: str
    status: str
    attempts: int
    cycles: int
    tokenUsage: TokenTotals
    answer: Any
    outcome: dict[str, Any] | None
    input: dict[str, Any]
    model: dict[str, Any]
    limits: dict[str, Any]
    cancelRequested: bool
    startedBy: str | None = Field(default=None, description="Who started it (`key:<id>`, "
                                  "`oidc:<sub>`).")
    startedByName: str | None = Field(default=None, description="The same, as people know "
                                      "them (the person and the key's name).")
    createdAt: str | None
    startedAt: str | None
    endedAt: str | None
    integrity: IntegritySummary
    held: bool = Field(description="A legal hold keeps it (GET /holds?caseId=): it is "
                       "neither expired nor erased while it holds.")
    sensitive: SensitiveSummary | None = Field(
        description="Null when the agent's input marks nothing sensitive.")


class EventIntegrity(BaseModel):
    prevHash: str
    hash: str
    keyId: str
    sig: str


class StoredEnvelope(BaseModel):
    """One event of the trail, as on the bus, plus when it was stored."""

    model_config = ConfigDict(extra="allow")

    eventId: str
    caseId: str
    tenantId: str
    attempt: int
    seq: int
    eventType: str
    occurredAt: str
    recordedAt: str
    schemaVersion: int
    payload: dict[str, Any]
    integrity: EventIntegrity | None = Field(
        description="The event's place in its attempt's hash chain and its signature; "
                    "null for a version-1 event.")


class Trail(BaseModel):
    caseId: str
    events: list[StoredEnvelope]


class CancelAccepted(BaseModel):
    caseId: str
    status: str = Field(description="`cancelled` at once if no worker had it, else `cancelling`.")


class ReviewAccepted(BaseModel):
    caseId: str
    verdict: str = Field(description="confirm, override, return; or answer.")
    reviewer: dict[str, str] = Field(description="You, as the trail records you: subject (the "
                                     "person), via (oidc or key), keyId, name.")
    status: str = Field(description="`reviewed` (the trail records CASE_REVIEWED, then the "
                        "case's end or more cycles) or `answered` (the trail records the "
                        "waiting turn with your answer): the case goes on from it.")


class ReviewItem(BaseModel):
    caseId: str
    tenantId: str
    agent: str
    status: str
    decision: str | None
    answer: dict[str, Any] | None = Field(description="The agent's answer, as it waits.")
    checks: list[dict[str, Any]]
    reviewReasons: list[str] = Field(description="decision, failed_check, tenant_policy, "
                                     "question, second_review (a reviewer's override, the "
                                     "answer here, waits for a second person).")
    question: dict[str, str] | None = Field(
        default=None, description="The model's question (callId, question), when it waits "
        "for an answer (POST /cases/{id}/answer).")
    waitingSince: str | None
    startedByName: str | None = Field(default=None, description="Who started the case, as "
                                      "people know them.")
    dueAt: str | None = Field(description="When the review becomes overdue (the tenant's, "
                              "the agent's or the deployment's review deadline).")
    overdue: bool = Field(description="Past its due time: shown and alerted on; the case "
                          "still waits for a person (a deadline never decides).")
    startedBy: str | None
    createdAt: str | None
    keys: dict[str, str] = Field(default_factory=dict, description="The agent's business "
                                 "keys, as people know the case (sensitive ones not shown).")
    toolCalls: list[dict[str, Any]] | None = Field(
        default=None, description="GET /reviews/{id} only: the tool calls the answer rests "
        "on, in order (cycle, toolName, toolArgs, toolResult or error, mcpServer).")


class ReviewList(BaseModel):
    reviews: list[ReviewItem]


class AgentTool(BaseModel):
    name: str
    source: str
    description: str


class AgentDescription(BaseModel):
    name: str
    version: str
    description: str
    tools: list[AgentTool]
    inputSchema: dict[str, Any]
    defaultModel: dict[str, Any]
    defaultLimits: dict[str, Any]


class AgentList(BaseModel):
    agents: list[AgentDescription]


class Identity(BaseModel):
    """Who the request's credentials act as."""

    tenant: str = Field(description="The tenant whose cases the credentials reach.")
    subject: str = Field(description="`key:<keyId>` for an API key, `oidc:<sub>` for a "
                                     "token; recorded as who started or cancelled a case.")
    scopes: list[str] = Field(description="The scopes granted, sorted.")
    person: str | None = Field(default=None, description="The person behind the "
                               "credentials (an OIDC subject, or a key made `--person`); "
                               "absent for a service's key.")


class Health(BaseModel):
    status: str


class LogStatus(BaseModel):
    halted: bool = Field(description="The log has stopped vouching: its database's latest "
                         "checkpoint is behind (or forked from) the largest it signed, and "
                         "its routes answer 503.")
    reason: str | None = Field(description="behind or forked, while halted.")
    storedSize: int | None = Field(description="The database's latest checkpoint's size.")
    anchorSize: int | None = Field(description="The largest checkpoint the log signed, as "
                                   "the log-head stream keeps it (null: none seen).")


class Readiness(BaseModel):
    ready: bool = Field(description="Broker and database are reachable (whether the log is "
                        "halted or not: see log).")
    checks: dict[str, str]
    log: LogStatus | None = Field(default=None, description="Whether the transparency log "
                                  "vouches for what it serves (absent when the database "
                                  "cannot be reached).")


class VerifyAttempt(BaseModel):
    attempt: int
    events: int
    headHash: str | None
    ended: bool


class VerifyProblem(BaseModel):
    attempt: int | None
    seq: int | None
    code: str
    message: str


class VerifyReport(BaseModel):
    """The verdict on a case's trail: chains, signatures, completeness."""

    caseId: str
    verified: bool
    complete: bool
    events: int
    attempts: list[VerifyAttempt]
    problems: list[VerifyProblem]


class BundleEvent(BaseModel):
    attempt: int
    seq: int
    body: str | None = Field(description="The signed bytes, as UTF-8 text.")
    integrity: EventIntegrity | None


class SigningKey(BaseModel):
    keyId: str
    publicKey: str = Field(description="The 32 raw public-key bytes, base64.")
    createdAt: str | None
    retiredAt: str | None
    notValidAfter: str | None


class Bundle(BaseModel):
    """The offline bundle of one case (docs/bundle.md)."""

    model_config = ConfigDict(extra="allow")

    format: str
    caseId: str
    tenantId: str
    exportedAt: str
    case: dict[str, Any]
    events: list[BundleEvent]
    keys: list[SigningKey]


class SigningKeys(BaseModel):
    keys: list[SigningKey]


class CaseSummary(BaseModel):
    """One case in a search result (no input: that is on the case's own page)."""

    caseId: str
    agent: str
    status: str
    decision: str | None = Field(description="The answer's `decision`, for agents whose "
                                             "answer has one (null until it ends).")
    attempts: int
    cycles: int
    tokenUsage: TokenTotals
    startedBy: str | None
    startedByName: str | None = Field(
        default=None, description="Who started it, as people know them: the person and "
        "the key's name, a key's name, or the OIDC subject.")
    createdAt: str | None
    endedAt: str | None
    keys: dict[str, str] = Field(default_factory=dict, description="The agent's business "
                                 "keys (e.g. the applicant's id), as people know the case; "
                                 "a sensitive key is kept as a digest only and not shown.")


class CaseList(BaseModel):
    """A page of cases, newest first."""

    items: list[CaseSummary]
    nextCursor: str | None = Field(description="Pass as `cursor` for the next page; "
                                               "null on the last one.")


class AsyncApiDocument(BaseModel):
    """An AsyncAPI 3.0 document (https://www.asyncapi.com/docs/reference/specification/v3.0.0)."""

    model_config = ConfigDict(extra="allow")

    asyncapi: str
    info: dict[str, Any]
    channels: dict[str, Any]
    operations: dict[str, Any]
    components: dict[str, Any]


class PolicyView(BaseModel):
    policyId: int
    agent: str = Field(description="An agent, or * for the tenant's default.")
    version: int
    keepDays: int | None = Field(description="Null: kept for good.")
    countedFrom: str
    businessKey: str | None
    personalDataDays: int | None
    archive: bool
    preset: str | None
    reason: str
    setBy: str
    setAt: str
    needsSecondPerson: bool = Field(description="It keeps less than the version before it: "
                                    "in force once another person approved it.")
    approvedBy: str | None = None
    approvedAt: str | None = None
    inForce: bool | None = None


class PresetView(BaseModel):
    name: str
    keepDays: int
    personalDataDays: int | None
    source: str = Field(description="The rule the preset follows.")


class PolicyList(BaseModel):
    floorDays: int = Field(description="No policy keeps a case less (checked by the database).")
    floorSource: str
    default: str
    presets: list[PresetView]
    policies: list[PolicyView]


class PlannedCase(BaseModel):
    caseId: str
    agent: str
    policyId: int
    policyVersion: int
    countedFrom: str
    expiresAt: str | None
    personalDataUntil: str | None
    held: bool = Field(description="A legal hold keeps it: neither expired nor erased.")
    archivedFirst: bool = Field(description="Its policy archives: its bundle is written to "
                                "the archive before it expires.")


class RetentionPlan(BaseModel):
    cases: list[PlannedCase]
    held: int
    wouldAct: int
    wouldArchive: int = Field(description="Of those it would act on, how many are archived "
                              "before they expire.")


class HoldKeyView(BaseModel):
    field: str
    value: str = Field(description="The value, or its keyed digest for a sensitive field.")


class HoldRelease(BaseModel):
    person: str
    reason: str
    releasedAt: str


class HoldView(BaseModel):
    holdId: str
    scope: str
    caseId: str | None = None
    key: HoldKeyView | None = None
    reason: str
    placedBy: str
    placedAt: str
    endsAt: str | None
    active: bool
    releases: list[HoldRelease]


class HoldList(BaseModel):
    holds: list[HoldView]


class HoldReleased(BaseModel):
    holdId: str
    releasedBy: list[str]
    released: bool = Field(description="True once two persons have released it.")


class BusinessDateKept(BaseModel):
    field: str
    value: str = Field(description="As kept: the value, or its keyed digest for a sensitive "
                       "field.")
    endedOn: str


class BacktestProgress(BaseModel):
    done: int = Field(description="Cases run so far.")
    selected: int | None = Field(description="Cases the selection found (once read).")


class BacktestView(BaseModel):
    """A backtest: what was asked, how far it got, and once done what its signed record
    says (``record``, ``summary``) with every per-case result."""

    backtestId: str
    agent: str
    status: Literal["queued", "running", "done", "failed"]
    requestedBy: str
    requestedAt: str
    startedAt: str | None
    finishedAt: str | None
    progress: BacktestProgress
    problem: str | None = Field(default=None, description="Why it failed.")
    request: dict[str, Any]
    record: dict[str, Any] | None = Field(default=None, description=(
        "The signed record: hash, prevHash, keyId, chainSeq, leafIndex in the log."))
    championDigests: list[str] | None = None
    challenger: dict[str, Any] | None = None
    selection: dict[str, Any] | None = None
    seconds: float | None = None
    stopped: str | None = None
    summary: dict[str, Any] | None = Field(default=None, description=(
        "The decision matrix, agreement with reviewers, changed cases, unanswered calls, "
        "tokens."))
    results: list[dict[str, Any]] | None = None


class BacktestList(BaseModel):
    backtests: list[BacktestView]


class BacktestBundle(BaseModel):
    """``casetrail-backtest/1`` (docs/bundle.md, "A backtest's bundle")."""

    format: Literal["casetrail-backtest/1"]
    backtestId: str
    exportedAt: str
    record: dict[str, Any] = Field(description="body (the signed bytes), integrity, logProof")
    results: list[dict[str, Any]]
    keys: list[dict[str, Any]]
    log: dict[str, Any] | None = None
