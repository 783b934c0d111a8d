"""Starting a case: validated, admitted by the tenant's quota, recorded as ``queued``
with its sensitive values sealed, and its start command confirmed by the broker before
the caller hears yes (docs/design.md, "A case, step by step")."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
from pydantic import ValidationError

from casetrail.adapters.bus.start_commands import send_start
from casetrail.adapters.store import NewCase, rate_wait
from casetrail.agents import AGENTS
from casetrail.agents.profile import AgentProfile
from casetrail.cases.configured import described
from casetrail.cases.errors import Conflict, Forbidden, Invalid, Issue, NotAccepted, OverQuota
from casetrail.cases.requests import CaseRequest, LimitsRequest
from casetrail.cases.services import CaseServices, TenantLoad
from casetrail.cases.text import refuse_unstorable
from casetrail.config import Settings
from casetrail.contract.auth import Principal, Scope
from casetrail.contract.events import CaseStatus, Limits, new_case_id
from casetrail.engine.answers import DEFAULT_ANSWER_RETRIES
from casetrail.errors import BusUnavailable, PublishRejected
from casetrail.privacy.sensitive import placeholder, split
from casetrail.providers import model_problem
from casetrail.telemetry import metrics
from casetrail.trail.person_actions import sign_object, start_object

log = logging.getLogger("casetrail.cases")

START_PUBLISHING_SECONDS = 30.0
"""How long one request holds the right to publish a case's start command (the column
default of ``start_publishing_until`` for a new case, migration 011)."""


@dataclass(frozen=True)
class Started:
    """A case accepted: its row as recorded, and whether this request made it
    (``False``: the same ``Idempotency-Key`` was used before, for the same request)."""

    case: dict[str, Any]
    created: bool


def offered(settings: Settings) -> list[str]:
    """The agents a case may name here (bench-only ones in bench mode only)."""
    return [name for name, agent in AGENTS.items() if settings.bench_mode or not agent.bench_only]


def _agent(services: CaseServices, name: str) -> AgentProfile:
    settings = services.settings
    agent = AGENTS.get(name)
    if agent is not None and agent.bench_only and not settings.bench_mode:
        raise Invalid(Issue(("body", "agent"), f"agent {agent.name!r} is for benchmarks and "
                                               "tests only (CASETRAIL_BENCH_MODE=1)"))
    if agent is None:
        raise Invalid(Issue(("body", "agent"), f"unknown agent {name!r}; the agents are: "
                            + ", ".join(sorted(offered(settings)))))
    if problems := services.unconfigured.get(agent.name):
        raise Invalid(Issue(("body", "agent"), described(agent.name, problems)))
    return agent


def _limits(requested: LimitsRequest | None, default: Limits, settings: Settings,
            answers: bool) -> Limits:
    max_cycles = (requested.max_cycles if requested else None) or default.max_cycles
    deadline = (requested.deadline_seconds if requested else None) or default.deadline_seconds
    issues = []
    if max_cycles > settings.max_cycles_cap:
        issues.append(Issue(("body", "limits", "maxCycles"),
                            f"must be at most {settings.max_cycles_cap}"))
    if deadline > settings.max_deadline_seconds:
        issues.append(Issue(("body", "limits", "deadlineSeconds"),
                            f"must be at most {settings.max_deadline_seconds:g}"))
    if issues:
        raise Invalid(*issues)
    retries = (requested.max_answer_retries if requested else None)
    if retries is None:
        retries = default.max_answer_retries
    return Limits(max_cycles=max_cycles, deadline_seconds=deadline,
                  max_answer_retries=DEFAULT_ANSWER_RETRIES if retries is None and answers
                  else retries)


async def start(services: CaseServices, principal: Principal, request: CaseRequest,
                idempotency_key: str | None = None,
                via: dict[str, str] | None = None) -> Started:
    """Validate, record the case as ``queued``, publish its start command with a
    confirm. A repeated ``idempotency_key`` returns the first case (``Conflict`` when
    it was used for another request). ``via``: how another agent started it (A2A), signed
    with the start and so recorded in ``CASE_STARTED.startAction``."""
    settings = services.settings
    if request.model is not None and not principal.allows(Scope.MODELS_OVERRIDE):
        raise Forbidden("this API key lacks the scope 'models:override' (needed to send model)")
    agent = _agent(services, request.agent)
    await services.gate.check(services.backtests, services.evidence.keys, agent,
                              principal.tenant)
    try:
        validated = agent.input_model.model_validate(request.input)
    except ValidationError as exc:
        raise Invalid(*(Issue(("body", "input", *e["loc"]), e["msg"])
                        for e in exc.errors(include_url=False))) from None
    refuse_unstorable(request.model_dump(mode="python", by_alias=True), "body")
    limits = _limits(request.limits, agent.default_limits, settings,
                     agent.answer_model is not None)
    model = request.model or agent.default_model
    if problem := model_problem(model, settings):
        raise Invalid(Issue(("body", "model", problem[0]), problem[1]))
    if model.provider == "scripted" and agent.script is None:
        raise Invalid(Issue(("body", "model", "provider"), f"agent {agent.name!r} has no "
                                                           "scripted brain: name a real model"))
    if request.model is not None and request.model.latency_ms is not None \
            and not settings.bench_mode:
        raise Invalid(Issue(("body", "model", "latencyMs"), "latencyMs is for benchmarks and "
                                                             "tests only (CASETRAIL_BENCH_MODE=1)"))
    case_input = validated.model_dump(mode="json", by_alias=True)
    stored_input, values = split(agent.input_model, case_input)
    case_id = new_case_id()
    # Keyed: the digest of a request that held a sensitive value must not let anyone
    # who reads `cases` test guesses of that value (after an erasure too).
    digest = services.secrets.vault.request_digest(orjson.dumps(
        {"agent": agent.name, "input": case_input, "limits": limits.model_dump(),
         "model": model.model_dump()}, option=orjson.OPT_SORT_KEYS))
    new = NewCase(
        case_id=case_id, agent=agent.name, input=stored_input,
        sealed=services.secrets.vault.seal(case_id, values) if values else None,
        placeholders=tuple(values),
        model=model.model_dump(mode="json", by_alias=True, exclude_none=True),
        limits=limits.model_dump(mode="json", by_alias=True),
        request_digest=digest, idempotency_key=idempotency_key,
        tenant_id=principal.tenant, started_by=principal.subject,
        keys=_keys(services, agent, case_input, values),
        start_action=_signed_start(services, case_id, principal, agent.name, stored_input,
                                   via),
    )
    if idempotency_key is None or not await services.store.idempotency_key_used(
            principal.tenant, idempotency_key):
        await _within_quota(services, principal.tenant)
    row, created = await services.store.insert_case(new)
    if created:
        await _publish_start(services, row, forget_on_failure=True)
        metrics.CASES_ACCEPTED.labels(agent.name).inc()
        return Started(row, True)
    if row["request_digest"] != digest:
        raise Conflict("Idempotency-Key was already used with another request")
    if row["start_confirmed_at"] is None and row["attempts_claimed"] == 0 \
            and row["status"] == CaseStatus.QUEUED:
        # The first request may have died before its start command was confirmed:
        # publish one more copy (the claim runs it once), but only one, however many
        # re-sends arrive (the lease), and within the tenant's rate, so re-sends cannot
        # flood the start queue.
        await _within_rate(services, principal.tenant)
        if await services.store.take_start_resend(row["case_id"], START_PUBLISHING_SECONDS):
            await _publish_start(services, row, forget_on_failure=False)
    return Started(row, False)


def _signed_start(services: CaseServices, case_id: uuid.UUID, principal: Principal,
                  agent: str, stored_input: dict[str, Any],
                  via: dict[str, str] | None) -> dict[str, Any]:
    """The case's start, signed with the API's action key: a worker runs only a case
    whose row this signature holds for."""
    if services.action_signer is None:
        raise NotAccepted("this process holds no action key (CASETRAIL_ACTION_KEY_FILE): a "
                          "case is accepted only with its start signed")
    return sign_object(services.action_signer, start_object(
        case_id, principal.tenant, agent, principal.subject, stored_input,
        datetime.now(UTC), via)).as_json()


def _keys(services: CaseServices, agent: AgentProfile, case_input: dict[str, Any],
          values: dict[str, str]) -> tuple[tuple[str, str, bool], ...]:
    """The case's business keys as kept: ``(field, value, False)``, or for a sensitive
    field ``(field, its keyed digest, True)``."""
    kept = []
    for field in agent.keys:
        value = case_input.get(field)
        if value is None or isinstance(value, dict | list) or not str(value).strip():
            continue
        text = str(value)[:300]
        if placeholder(field) in values:
            kept.append((field, services.secrets.vault.key_digest(field, text), True))
        else:
            kept.append((field, text, False))
    return tuple(kept)


async def _within_quota(services: CaseServices, tenant: str) -> None:
    """``OverQuota`` when the tenant has too many cases queued or running, or started
    too many in the last minute (checked before the case is kept)."""
    max_active, max_per_minute = services.settings.quota(tenant)
    load = await services.quotas.load(tenant, max_active, max_per_minute)
    if load.active >= max_active:
        raise OverQuota(f"tenant {tenant!r} has {max_active} cases queued or running, its "
                        "limit; try again when some have ended", retry_after=5)
    await _within_rate(services, tenant, load)


async def _within_rate(services: CaseServices, tenant: str, load: TenantLoad | None = None
                       ) -> None:
    """``OverQuota`` when the tenant started (or re-sent) its limit of cases in the last
    minute."""
    max_active, max_per_minute = services.settings.quota(tenant)
    if load is None:
        load = await services.quotas.load(tenant, max_active, max_per_minute)
    if load.recent >= max_per_minute:
        wait = await rate_wait(services.pool, tenant, max_per_minute)
        raise OverQuota(f"tenant {tenant!r} started {max_per_minute} cases in the last "
                        "minute, its limit", retry_after=wait)
    load.admitted()


async def _publish_start(services: CaseServices, row: dict[str, Any], *,
                         forget_on_failure: bool) -> None:
    case_id = row["case_id"]
    try:
        await send_start(services.publisher, services.topology, case_id, row["tenant_id"],
                         row["agent"])
        services.note_start_confirmed(case_id)
    except (BusUnavailable, PublishRejected) as exc:
        if forget_on_failure and not await services.store.delete_unstarted(case_id):
            # The broker took the command after all (a node died with its confirm): a
            # worker claimed the case, so it is accepted, not refused.
            log.warning("start command for %s unconfirmed (%s) but the case was claimed",
                        case_id, exc)
            return
        log.error("start command for %s not accepted: %s", case_id, exc)
        # A full start queue (its length limit, reject-publish) lands here too.
        raise NotAccepted("message broker did not accept the case; nothing was kept") from exc
