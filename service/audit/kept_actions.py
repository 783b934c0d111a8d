"""Whether a person's kept action may be recorded: the one rule the worker applies
before it records a review, an answer or a cancel of a waiting case, and the audit
applies again to every action the worker refused (docs/design.md, "People"; "Served
values"). A refusal of an action that keeps the rule is a worker's role removing a
person's decision, and the audit names it (``refused_valid_action``).

The rule: signed by a registered action key, for the wait the trail records (a review,
a second person's review of an override, or the model's question), four eyes kept (not
the starter; on a second review, nobody who reviewed before), an override within the
agent's answer schema. No I/O: the caller reads the record, the persons and the keys.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from casetrail.adapters.store.cases import ParkedAction
from casetrail.agents.profile import AgentProfile
from casetrail.engine.case import Parked
from casetrail.trail.person_actions import PersonAction, Refusal, vet_action, wait_kind


def kept_action_refusal(case_id: uuid.UUID, tenant_id: str, agent: AgentProfile,
                        parked: Parked, action: ParkedAction, keys: Mapping[str, Any], *,
                        starter: str | None, reviewers: tuple[str, ...],
                        person: str | None) -> Refusal | None:
    """Why ``action``, kept for the wait ``parked`` of ``case_id``, may not be recorded
    (``None``: it may). ``starter``, ``reviewers`` and ``person`` are persons as four
    eyes compares them (linked identities are one)."""
    asked = None if parked.question is None else parked.question.call_id
    given = action.decision or {}
    answered = action.kind == "answer"
    expected = PersonAction(
        case_id, tenant_id, parked.attempt, wait_kind(asked, parked.reasons), action.kind,
        action.acted_at, person=action.reviewer,
        by=action.signed.signed.get("by") if action.signed and action.kind == "cancel"
        else None,
        verdict=action.verdict, reason=action.reason,
        decision=action.decision if action.kind == "review" else None,
        call_id=given.get("callId") if answered else None,
        answer=given.get("answer") if answered else None)
    errors: tuple[str, ...] = ()
    if action.verdict == "override":
        checked = None if agent.answering is None else agent.answering.validate(
            action.decision)
        errors = ("the agent declares no answer schema",) if checked is None else \
            tuple(checked[1]) if checked[0] is None else ()
    return vet_action(expected, action.signed, keys, asked=asked, starter=starter,
                      reviewers=reviewers, person=person, decision_errors=errors)


def acting_identity(action: ParkedAction) -> list[tuple[str, str]]:
    """The identity that acted, as ``(via, subject)`` (none for a cancel by a key)."""
    acting = action.reviewer or {}
    return [(str(acting.get("via")), str(acting["subject"]))] if acting.get("subject") \
        else []
