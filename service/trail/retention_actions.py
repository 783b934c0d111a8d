"""A person's acts about keeping records, signed by the API's action key like a review
(docs/design.md, "Keeping records as long as the law says"; casetrail.trail.person_actions
for the signed bytes).

A retention policy, its approval, a legal hold and a hold's release are rows a
component's database password could write. The API signs each; the worker's retention
pass rebuilds the object from the row and deletes nothing on a policy or an approval
whose signature does not hold under a registered action key, and counts a hold released
only by releases that do. The objects hold a digest of the free text (the reason), never
the text.

No I/O.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from casetrail.contract.integrity import IntegrityError
from casetrail.trail.person_actions import (
    SignedAction,
    acted_at_text,
    signature_problem,
    text_digest,
)


def policy_object(row: Mapping[str, Any]) -> dict[str, Any]:
    """What the API signs when it keeps a policy version (``row``: its columns)."""
    return {"kind": "retention-policy", "tenantId": row["tenant_id"], "agent": row["agent"],
            "version": row["version"], "keepDays": row["keep_days"],
            "countedFrom": row["counted_from"], "businessKey": row["business_key"],
            "personalDataDays": row["personal_data_days"],
            "reasonSha256": text_digest(row["reason"]), "by": row["set_by"],
            "actedAt": acted_at_text(row["set_at"]),
            # (named only when set, so that versions signed before it existed still check)
            **({"archive": True} if row.get("archive") else {})}


def approval_object(tenant: str, agent: str, version: int, by: str, at: datetime
                    ) -> dict[str, Any]:
    return {"kind": "retention-approval", "tenantId": tenant, "agent": agent,
            "version": version, "by": by, "actedAt": acted_at_text(at)}


def hold_object(row: Mapping[str, Any]) -> dict[str, Any]:
    ends = row["ends_at"]
    return {"kind": "legal-hold", "holdId": str(row["hold_id"]), "tenantId": row["tenant_id"],
            "scope": row["scope"], "caseId": row["case_id"] and str(row["case_id"]),
            "keyField": row["key_field"], "keyValue": row["key_value"],
            "reasonSha256": text_digest(row["reason"]),
            "endsAt": None if ends is None else acted_at_text(ends), "by": row["placed_by"],
            "actedAt": acted_at_text(row["placed_at"])}


def release_object(hold_id: uuid.UUID | str, person: str, reason: str, at: datetime
                   ) -> dict[str, Any]:
    return {"kind": "hold-release", "holdId": str(hold_id), "by": person,
            "reasonSha256": text_digest(reason), "actedAt": acted_at_text(at)}


def problem(expected: Mapping[str, Any], action: Any, keys: Mapping[str, Any]) -> str | None:
    """Why the row's ``action`` does not vouch for ``expected`` (the object rebuilt from
    the row), or ``None`` when an action key signed exactly that."""
    if action is None:
        return "no action key signed it"
    try:
        signed = SignedAction.from_json(action)
    except IntegrityError as exc:
        return str(exc)
    if signed.signed != dict(expected):
        return "the row differs from what the action key signed"
    return signature_problem(signed, keys)


def keeps_less(new: Mapping[str, Any], earlier: Mapping[str, Any] | None) -> bool:
    """Whether policy version ``new`` keeps less than ``earlier`` (``None``: nothing was
    deleted before it): the database's rule for a second person, applied to a row the
    caller chose."""
    def shorter(field: str) -> bool:
        mine = new[field]
        return mine is not None and (earlier is None or earlier[field] is None
                                     or mine < earlier[field])

    return shorter("keep_days") or shorter("personal_data_days") or (
        earlier is not None and new["counted_from"] != earlier["counted_from"]) or (
        earlier is not None and bool(earlier.get("archive")) and not new.get("archive"))


def needs_second_person(new: Mapping[str, Any], earlier: Sequence[Mapping[str, Any]],
                        keys: Mapping[str, Any]) -> bool:
    """Whether ``new`` takes a second person, judged against the latest of its ``earlier``
    versions (newest first) that an action key signed — never against a row alone: a
    version written with a component's database password cannot make the next one look
    like no shortening at all."""
    signed = next((row for row in earlier
                   if problem(policy_object(row), row.get("action"), keys) is None), None)
    return keeps_less(new, signed)
