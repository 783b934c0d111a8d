"""A person decides: the review of a case waiting for one, and the queue of those that
wait (docs/design.md, "Review").

A review is kept in Postgres first (``case_actions``, once per wait: a second is a
conflict), then the case's start command goes to the workers: the next attempt records
the review in the trail (``CASE_REVIEWED``) and ends the case with the reviewed decision,
or, when the case was returned, goes on with the reviewer's note. Only the worker emits
events. Four eyes: the reviewer is a person (an OIDC subject, or a key made for one) and
never the person who started the case, whichever credential either used.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from casetrail.adapters.bus.start_commands import send_start
from casetrail.adapters.store import Wait, principal_names, utc_text
from casetrail.adapters.store.evidence_views import business_keys, recorded_tool_calls
from casetrail.agents import AGENTS
from casetrail.cases.errors import Conflict, Forbidden, Invalid, Issue, NotAccepted, NotFound
from casetrail.cases.reading import owned
from casetrail.cases.services import CaseServices
from casetrail.cases.text import refuse_unstorable
from casetrail.contract.auth import REVIEW_SCOPE, Principal, Scope
from casetrail.contract.events import ENDED_STATUSES, CaseStatus
from casetrail.errors import BusUnavailable, PublishRejected
from casetrail.trail.person_actions import PersonAction, sign_action

log = logging.getLogger("casetrail.cases")

Verdict = Literal["confirm", "override", "return"]
MAX_REASON = 4000


@dataclass(frozen=True)
class Reviewed:
    """A review (or an answer) kept: the workers take the case up from here."""

    case_id: uuid.UUID
    verdict: Verdict | Literal["answer"]
    reviewer: dict[str, str]


def _reviewer_of(principal: Principal) -> dict[str, str]:
    if not principal.allows(REVIEW_SCOPE):
        raise Forbidden(f"reviewing needs the scope {REVIEW_SCOPE.value!r}, held by a person (an "
                        "OIDC subject, or a key made with `keys create --person`)")
    return principal.reviewer()


async def review(services: CaseServices, principal: Principal, case_id: uuid.UUID,
                 verdict: Verdict, reason: str, decision: dict[str, Any] | None = None
                 ) -> Reviewed:
    """Confirm the agent's decision, override it with ``decision`` (valid for the
    agent's answer schema), or return the case to the model with ``reason`` as its note.
    ``Forbidden`` for whoever started the case (and, on a second review, whoever
    reviewed it before); ``Conflict`` when it is not waiting for review or somebody
    already reviewed this wait."""
    reviewer = _reviewer_of(principal)
    _text(reason, "reason")
    person = await _person(services, reviewer)
    row = await _four_eyes(services, principal, case_id, person)
    decided = _decision(row, verdict, decision)
    wait = await _current_wait(services, case_id)
    if wait.kind == "question":
        raise Conflict(f"case {case_id} waits for an answer to the model's question "
                       f"{wait.call_id} (POST /cases/{case_id}/answer), not for a review")
    _not_excluded(person, case_id, wait)
    await _keep(services, PersonAction(
        case_id, row["tenant_id"], wait.attempt, wait.kind, "review", datetime.now(UTC),
        person=reviewer, verdict=verdict, reason=reason, decision=decided),
        reviewer, decided, person)
    await _go_on(services, row)
    return Reviewed(case_id, verdict, reviewer)


async def _current_wait(services: CaseServices, case_id: uuid.UUID) -> Wait:
    """The wait the worker noted; ``Conflict`` when there is none, or it has been
    acted on."""
    wait = await services.store.current_wait(case_id)
    if wait is None:
        raise Conflict(f"case {case_id} is not awaiting review (one that has just begun to "
                       "wait is noted by its worker within moments: try again)")
    if wait.acted:
        raise Conflict(f"case {case_id} has already been reviewed (or answered); it goes "
                       "on from that")
    return wait


async def _person(services: CaseServices, reviewer: dict[str, str]) -> str:
    """The person four eyes compares: the one an operator linked this identity to (an
    OIDC subject, or a key's person id), else the identity's own subject."""
    return (await services.store.persons([(reviewer["via"], reviewer["subject"])]))[0]


def _not_excluded(person: str, case_id: uuid.UUID, wait: Wait) -> None:
    """Four eyes, as the wait was noted: ``Forbidden`` for a person it excludes."""
    if person in wait.excludes:
        if wait.kind == "second_review":
            raise Forbidden(f"{person} reviewed case {case_id} before: a second "
                            "person confirms, changes or returns the override (four eyes)")
        raise Forbidden(f"{person} started case {case_id}: another person reviews "
                        "it (four eyes)")


async def _keep(services: CaseServices, action: PersonAction,
                reviewer: dict[str, str] | None, decision: dict[str, Any] | None,
                person: str | None) -> None:
    """Sign ``action`` with the API's action key and keep it, checked again in the same
    statement against the wait it answers."""
    if services.action_signer is None:
        raise NotAccepted("this process holds no action key (CASETRAIL_ACTION_KEY_FILE): a "
                          "person's action is kept only signed")
    signed = sign_action(services.action_signer, action)
    kept = await services.store.record_action(action, signed, reviewer, decision, person)
    if kept == "taken":
        raise Conflict(f"case {action.case_id} has already been "
                       f"{'answered' if action.kind == 'answer' else 'reviewed'}; it goes on "
                       "from that")
    if kept == "moved":
        raise Conflict(f"case {action.case_id}'s wait changed while this was kept; look at "
                       "the case again")
    if kept == "not_parked":
        raise Conflict(f"case {action.case_id} is not waiting for a person")


def _text(value: str, field: str) -> None:
    if not value.strip():
        raise Invalid(Issue(("body", field), "must not be blank"))
    if len(value) > MAX_REASON:
        raise Invalid(Issue(("body", field), f"at most {MAX_REASON} characters"))
    refuse_unstorable(value, "body", field)


async def _four_eyes(services: CaseServices, principal: Principal, case_id: uuid.UUID,
                     person: str) -> dict[str, Any]:
    """The case, when the caller (``person``) may act on it: not the person who started
    it (whichever credential or linked identity either used), and it has not ended."""
    row = await owned(services, principal, case_id)
    starter = await services.store.person_of(row["started_by"])
    if starter is not None and starter == person:
        raise Forbidden(f"{person} started case {case_id}: another person reviews "
                        "it (four eyes)")
    if row["status"] in ENDED_STATUSES:
        raise Conflict(f"case {case_id} is {row['status']}, not awaiting review")
    return row


async def answer(services: CaseServices, principal: Principal, case_id: uuid.UUID,
                 call_id: str, text: str) -> Reviewed:
    """Answer the question the model asked a person (its call ``call_id``): kept once
    per wait, then the next attempt records the waiting turn with this answer as the
    question's result (``answeredBy``: the caller) and goes on."""
    reviewer = _reviewer_of(principal)
    _text(text, "answer")
    person = await _person(services, reviewer)
    row = await _four_eyes(services, principal, case_id, person)
    wait = await services.store.current_wait(case_id)
    if wait is None or wait.kind != "question":
        raise Conflict(f"case {case_id} waits for no answer to a question")
    if wait.call_id != call_id:
        raise Invalid(Issue(("body", "callId"), f"the case waits on question "
                                                f"{wait.call_id!r}, not {call_id!r}"))
    if wait.acted:
        raise Conflict(f"the question {call_id} of case {case_id} has already been answered")
    _not_excluded(person, case_id, wait)
    await _keep(services, PersonAction(
        case_id, row["tenant_id"], wait.attempt, wait.kind, "answer", datetime.now(UTC),
        person=reviewer, call_id=call_id, answer=text), reviewer,
        {"callId": call_id, "answer": text}, person)
    await _go_on(services, row)
    return Reviewed(case_id, "answer", reviewer)


def _decision(row: dict[str, Any], verdict: Verdict, decision: dict[str, Any] | None
              ) -> dict[str, Any] | None:
    """An override's decision, as the agent's answer schema has it."""
    if verdict != "override":
        if decision is not None:
            raise Invalid(Issue(("body", "decision"), f"only an override gives a decision "
                                                      f"(this review's verdict is {verdict})"))
        return None
    if decision is None:
        raise Invalid(Issue(("body", "decision"), "an override gives the decision, valid for "
                                                  "the agent's answer schema"))
    refuse_unstorable(decision, "body", "decision")
    agent = AGENTS.get(row["agent"])
    answering = None if agent is None else agent.answering
    if answering is None:
        raise Conflict(f"agent {row['agent']!r} declares no answer schema here to check an "
                       "override against")
    answer, errors = answering.validate(decision)
    if answer is None:
        raise Invalid(*(Issue(("body", "decision"), e) for e in errors))
    return answer


async def _go_on(services: CaseServices, row: dict[str, Any]) -> None:
    """Send the case's start command: the claim finds what was kept. Unconfirmed, the
    kept action stands and a worker's sweeper sends it again (service/components/sweeper.py)."""
    try:
        await send_start(services.publisher, services.topology, row["case_id"],
                         row["tenant_id"], row["agent"])
    except (BusUnavailable, PublishRejected) as exc:
        log.warning("start command for reviewed case %s not confirmed (%s); the sweeper "
                    "sends it again", row["case_id"], exc)


async def cancel_parked(services: CaseServices, row: dict[str, Any], by: str | None
                        ) -> bool:
    """Keep a cancel of a case waiting for a person (by ``by``), signed, as what was
    done about its wait (the next attempt records ``CASE_CANCELLED``); ``False`` when it
    is not waiting (it runs, or goes on from a review: then it is cancelled as a running
    case is)."""
    if row["status"] != CaseStatus.AWAITING_REVIEW and row["parked_attempt"] is None:
        return False
    wait = await services.store.current_wait(row["case_id"])
    if wait is None or wait.acted:
        return False
    try:
        await _keep(services, PersonAction(
            row["case_id"], row["tenant_id"], wait.attempt, wait.kind, "cancel",
            datetime.now(UTC), by=by), None, None, None)
    except Conflict:
        return False
    return True


async def after_cancel(services: CaseServices, row: dict[str, Any]) -> None:
    await _go_on(services, row)


async def open_reviews(services: CaseServices, principal: Principal, *,
                       agent: str | None = None, decision: str | None = None,
                       checks_failed: bool | None = None, overdue: bool | None = None,
                       limit: int = 100) -> list[dict[str, Any]]:
    """The caller's tenant's cases waiting for a person, oldest wait first."""
    _may_read_reviews(principal)
    tenant = None if principal.tenant == "*" else principal.tenant
    rows = await services.store.open_reviews(tenant, agent, decision, checks_failed, limit,
                                             overdue=overdue)
    names = await principal_names(services.pool, (row["started_by"] for row in rows))
    keys = await business_keys(services.pool, [row["case_id"] for row in rows])
    return [review_item(row) | {"startedByName": names.get(row["started_by"]),
                                "keys": keys.get(row["case_id"], {})}
            for row in rows]


def _may_read_reviews(principal: Principal) -> None:
    """The review queue shows a case's answer, checks and starter: for those who review
    or may read cases, never for a key that may only cancel or override models."""
    if not (principal.allows(REVIEW_SCOPE) or principal.allows(Scope.READ)):
        raise Forbidden("reading reviews needs the scope 'cases:review' or 'cases:read'")


def review_item(row: dict[str, Any]) -> dict[str, Any]:
    """One case of the review queue, as the API shows it."""
    waiting = row.get("waiting") or {}
    asked = waiting.get("question")
    return {
        **({} if asked is None else {"question": {"callId": asked["callId"],
                                                  "question": asked["question"]}}),
        "caseId": str(row["case_id"]),
        "tenantId": row["tenant_id"],
        "agent": row["agent"],
        "status": CaseStatus.AWAITING_REVIEW.value,
        "decision": row["decision"],
        "answer": waiting.get("answer", row["answer"]),
        "checks": waiting.get("checks", []),
        "reviewReasons": waiting.get("reviewReasons", []),
        "waitingSince": utc_text(row["parked_at"]),
        "dueAt": utc_text(row["review_due_at"]),
        "overdue": row["review_due_at"] is not None and row["overdue"],
        "startedBy": row["started_by"],
        "createdAt": utc_text(row["created_at"]),
    }


async def one_review(services: CaseServices, principal: Principal, case_id: uuid.UUID
                  ) -> dict[str, Any]:
    """One case of the queue; ``NotFound`` when it is not waiting for review."""
    _may_read_reviews(principal)
    row = await owned(services, principal, case_id)
    found = await services.store.open_reviews(row["tenant_id"], None, None, None, 1, case_id)
    if not found:
        raise NotFound(f"case {case_id} is not awaiting review")
    keys = await business_keys(services.pool, [case_id])
    return review_item(found[0]) | {
        "keys": keys.get(case_id, {}),
        "toolCalls": await recorded_tool_calls(services.pool, case_id)}
