"""Keeping records as long as the law says (docs/design.md, "Keeping records as long as
the law says"): retention policies, business dates and legal holds, as people set them
through ``/retention`` and ``/holds`` (and ``casetrail retention`` / ``holds``).

The default keeps everything. A change that shortens what is kept needs a second
person (the database decides which changes do); so does releasing a hold. Persons are
compared as four eyes compares them (linked identities are one person). The worker's
retention pass (service/components/retention.py) acts on what is in force.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any, Literal

from casetrail.adapters.bus.journal import journal
from casetrail.adapters.store import KeyRegistry
from casetrail.adapters.store.retention import Refused, Taken
from casetrail.agents import AGENTS
from casetrail.cases.errors import Conflict, Forbidden, Invalid, Issue, NotAccepted, NotFound
from casetrail.cases.reading import owned
from casetrail.cases.services import CaseServices
from casetrail.cases.text import refuse_unstorable
from casetrail.contract.auth import Principal, Scope
from casetrail.privacy.sensitive import sensitive_field
from casetrail.trail.person_actions import sign_object
from casetrail.trail.retention_actions import (
    approval_object,
    hold_object,
    needs_second_person,
    policy_object,
    release_object,
)


@dataclass(frozen=True)
class Preset:
    keep_days: int
    personal_data_days: int | None
    source: str


PRESETS: dict[str, Preset] = {
    "ai-act-minimum": Preset(183, None, "EU AI Act Art. 19 and Art. 26(6): logs of high-risk "
                             "AI systems kept at least six months"),
    "sec-17a-4": Preset(2192, None, "SEC Rule 17a-4 and FINRA Rule 4511: broker-dealer records "
                        "kept six years"),
    "amlr": Preset(1827, 1827, "EU AMLR Art. 77: records kept five years (from the end of the "
                   "business relationship, with countedFrom business_date), then personal "
                   "data deleted"),
}
"""Policies that name their source; a request may take one and change what it says."""


def _now() -> datetime:
    return datetime.now(UTC)


def _signed(services: CaseServices, signed: dict[str, Any]) -> dict[str, Any]:
    """``signed`` under the API's action key, as the row keeps it: the worker deletes
    nothing on an act no action key vouches for."""
    if services.action_signer is None:
        raise NotAccepted("this process holds no action key (CASETRAIL_ACTION_KEY_FILE): a "
                          "person's action is kept only signed")
    return sign_object(services.action_signer, signed).as_json()


async def _journal(services: CaseServices, entry: dict[str, Any]) -> None:
    """Kept off the database before it is made (casetrail.adapters.bus.journal), so that
    a restore of an older backup cannot undo it."""
    await journal(services.publisher, services.topology, entry)


def _needs(principal: Principal, scope: Scope) -> None:
    if not principal.allows(scope):
        raise Forbidden(f"this needs the scope {scope.value!r}")


async def person_of(services: CaseServices, principal: Principal) -> str:
    """Who acts, as the two-persons rules compare them: the person an operator linked
    the identity to, else its own person; a service key acts as itself."""
    if principal.person is None:
        return principal.subject
    reviewer = principal.reviewer()
    return (await services.store.persons([(reviewer["via"], reviewer["subject"])]))[0]


async def policies(services: CaseServices, principal: Principal) -> dict[str, Any]:
    if not (principal.allows(Scope.RETENTION) or principal.allows(Scope.READ)):
        raise Forbidden("reading retention policies needs 'retention:manage' or 'cases:read'")
    floor, source = await services.retention.floor()
    rows = await services.retention.policies(principal.tenant)
    return {"floorDays": floor, "floorSource": source,
            "default": "keep everything until a policy is set",
            "presets": [{"name": name, "keepDays": p.keep_days,
                         "personalDataDays": p.personal_data_days, "source": p.source}
                        for name, p in PRESETS.items()],
            "policies": [_policy_json(r) for r in rows]}


def _policy_json(row: dict[str, Any]) -> dict[str, Any]:
    approved = row.get("approved_by")
    return {"policyId": row["policy_id"], "agent": row["agent"], "version": row["version"],
            "keepDays": row["keep_days"], "countedFrom": row["counted_from"],
            "businessKey": row["business_key"], "personalDataDays": row["personal_data_days"],
            "archive": row["archive"], "preset": row["preset"], "reason": row["reason"],
            "setBy": row["set_by"], "setAt": row["set_at"].isoformat(),
            "needsSecondPerson": row["needs_second"],
            **({"approvedBy": approved, "approvedAt": row["approved_at"].isoformat()}
               if approved else {}),
            **({"inForce": row["in_force"]} if "in_force" in row else {})}


async def set_policy(services: CaseServices, principal: Principal, agent: str,
                     asked: dict[str, Any]) -> dict[str, Any]:
    """A new version of the tenant's policy for ``agent`` (``*``: every agent without
    its own). In force at once when it keeps at least as much as the one in force, else
    once a second person approves it. Only a person sets one: a service key is nobody
    whom a second person's approval could be another than."""
    _needs(principal, Scope.RETENTION)
    if principal.person is None:
        raise Forbidden("a person sets a retention policy (a key made with --person, or an "
                        "OIDC subject), never a service key")
    if agent != "*" and agent not in AGENTS:
        raise Invalid(Issue(("path", "agent"), f"no agent {agent!r}; the agents are: "
                            f"{', '.join(sorted(AGENTS))}, or * for the tenant's default"))
    fields = _policy_fields(asked)
    floor, source = await services.retention.floor()
    if fields["keep_days"] is not None and fields["keep_days"] < floor:
        raise Invalid(Issue(("body", "keepDays"), f"at least {floor} days ({source})"))
    by, at = await person_of(services, principal), _now()
    version = await services.retention.next_version(principal.tenant, agent)
    action = _signed(services, policy_object({
        **fields, "tenant_id": principal.tenant, "agent": agent, "version": version,
        "set_by": by, "set_at": at}))
    await _journal(services, {
        "kind": "policy", "tenantId": principal.tenant, "agent": agent, "version": version,
        "keepDays": fields["keep_days"], "countedFrom": fields["counted_from"],
        "businessKey": fields["business_key"], "personalDataDays": fields["personal_data_days"],
        "archive": fields["archive"], "preset": fields["preset"], "reason": fields["reason"],
        "setBy": by, "setAt": at.isoformat(), "action": action})
    try:
        row = await services.retention.set_policy(principal.tenant, agent, version, fields,
                                                  by, at, action)
    except Taken as exc:
        raise Conflict(str(exc)) from exc
    except Refused as exc:
        raise Invalid(Issue(("body",), str(exc).splitlines()[0])) from exc
    needs = await _needs_second(services, row)
    return _policy_json({**row, "needs_second": needs, "in_force": not needs})


async def _needs_second(services: CaseServices, row: dict[str, Any]) -> bool:
    """The database's answer, or — when an earlier version was written with a database
    password rather than signed — the answer against the latest signed one
    (``needs_second_person``): what the retention pass will hold it to."""
    if row["needs_second"]:
        return True
    keys = {k.key_id: k for k in await KeyRegistry(services.pool, "action_keys").all()}
    earlier = await services.retention.earlier(row["tenant_id"], row["agent"], row["version"])
    return needs_second_person(row, earlier, keys)


def _policy_fields(asked: dict[str, Any]) -> dict[str, Any]:
    preset_name = asked.get("preset")
    preset = PRESETS.get(preset_name) if preset_name else None
    if preset_name and preset is None:
        raise Invalid(Issue(("body", "preset"), f"no preset {preset_name!r}; the presets are: "
                            f"{', '.join(PRESETS)}"))
    keep = asked.get("keep_days", preset.keep_days if preset else None)
    personal = asked.get("personal_data_days",
                         preset.personal_data_days if preset else None)
    if personal is not None and keep is not None:
        personal = min(personal, keep)  # never longer than the case: it goes with it
    key = asked.get("business_key")
    if key is not None and not any(key in a.keys for a in AGENTS.values()):
        raise Invalid(Issue(("body", "businessKey"), f"no agent has a key {key!r}"))
    counted = "business_date" if key is not None else "ended"
    reason = asked["reason"]
    refuse_unstorable(reason, "body", "reason")
    return {"keep_days": keep, "personal_data_days": personal, "counted_from": counted,
            "business_key": key, "archive": bool(asked.get("archive", False)),
            "preset": preset_name,
            "reason": reason}


async def approve_policy(services: CaseServices, principal: Principal, policy_id: int
                         ) -> dict[str, Any]:
    """The second person's approval of a policy that shortens what is kept."""
    _needs(principal, Scope.RETENTION)
    if principal.person is None:
        raise Forbidden("a person approves a policy (a key made with --person, or an OIDC "
                        "subject)")
    row = await services.retention.policy(policy_id)
    if row is None or row["tenant_id"] != principal.tenant:
        raise NotFound(f"no policy {policy_id}")
    if not await _needs_second(services, row):
        raise Conflict(f"policy {policy_id} needed no second person: it is in force")
    person = await person_of(services, principal)
    if person == row["set_by"]:
        raise Forbidden(f"{person} set policy {policy_id}: another person approves it")
    approved_at = _now()
    action = _signed(services, approval_object(row["tenant_id"], row["agent"],
                                               row["version"], person, approved_at))
    await _journal(services, {"kind": "approval", "tenantId": row["tenant_id"],
                              "agent": row["agent"], "version": row["version"],
                              "approvedBy": person, "approvedAt": approved_at.isoformat(),
                              "action": action})
    try:
        await services.retention.approve(policy_id, person, approved_at, action)
    except Taken as exc:
        raise Conflict(str(exc)) from exc
    except Refused as exc:
        raise Forbidden(str(exc).splitlines()[0]) from exc
    return _policy_json({**row, "approved_by": person, "approved_at": approved_at})


def stored_key(field: str, value: str, services: CaseServices, where: str
               ) -> tuple[str, str]:
    """A business key as case_keys holds it: the value, or its keyed digest for a field
    some agent marks sensitive (the value is never kept)."""
    agents = [a for a in AGENTS.values() if field in a.keys]
    if not agents:
        raise Invalid(Issue(("body", where), f"no agent has a key {field!r}; the keys are: "
                            + ", ".join(sorted({k for a in AGENTS.values() for k in a.keys}))))
    refuse_unstorable(value, "body", "value")
    if any(sensitive_field(a.input_model, field) for a in agents):
        return field, services.secrets.vault.key_digest(field, value)
    return field, value


async def set_business_date(services: CaseServices, principal: Principal, field: str,
                            value: str, ended_on: date) -> dict[str, Any]:
    _needs(principal, Scope.RETENTION)
    field, stored = stored_key(field, value, services, "field")
    by, at = await person_of(services, principal), _now()
    await _journal(services, {"kind": "businessDate", "tenantId": principal.tenant,
                              "field": field, "value": stored,
                              "endedOn": ended_on.isoformat(), "setBy": by,
                              "setAt": at.isoformat()})
    await services.retention.set_business_date(principal.tenant, field, stored, ended_on, by,
                                               at)
    return {"field": field, "value": stored, "endedOn": ended_on.isoformat()}


async def plan(services: CaseServices, principal: Principal, limit: int) -> dict[str, Any]:
    """What the next passes would do: the cases past their time, which of them are
    archived before they go (their policy archives), and what holds keep."""
    if not (principal.allows(Scope.RETENTION) or principal.allows(Scope.HOLDS)):
        raise Forbidden("the retention plan needs 'retention:manage' or 'holds:manage'")
    rows = await services.retention.plan(principal.tenant, limit)
    items = [{"caseId": str(r["case_id"]), "agent": r["agent"], "policyId": r["policy_id"],
              "policyVersion": r["version"], "countedFrom": r["counted_at"].isoformat(),
              "expiresAt": r["expires_at"] and r["expires_at"].isoformat(),
              "personalDataUntil": r["personal_data_until"]
              and r["personal_data_until"].isoformat(), "held": r["held"],
              "archivedFirst": r["archive"]} for r in rows]
    return {"cases": items, "held": sum(1 for i in items if i["held"]),
            "wouldAct": sum(1 for i in items if not i["held"]),
            "wouldArchive": sum(1 for i in items if not i["held"] and i["archivedFirst"])}


async def place_hold(services: CaseServices, principal: Principal,
                     scope: Literal["case", "business_key", "tenant"],
                     case_id: uuid.UUID | None, key: tuple[str, str] | None, reason: str,
                     ends_at: datetime | None) -> dict[str, Any]:
    _needs(principal, Scope.HOLDS)
    refuse_unstorable(reason, "body", "reason")
    if (scope == "case") != (case_id is not None):
        raise Invalid(Issue(("body", "caseId"), "names the case exactly when scope is case"))
    if (scope == "business_key") != (key is not None):
        raise Invalid(Issue(("body", "key"), "names the field and value exactly when scope "
                            "is business_key"))
    if case_id is not None and await services.store.tombstone(case_id) is None:
        await owned(services, principal, case_id)  # 404 for another tenant's
    stored = stored_key(*key, services, "key.field") if key else None
    hold_id, by, at = uuid.uuid4(), await person_of(services, principal), _now()
    action = _signed(services, hold_object({
        "hold_id": hold_id, "tenant_id": principal.tenant, "scope": scope, "case_id": case_id,
        "key_field": stored and stored[0], "key_value": stored and stored[1],
        "reason": reason, "ends_at": ends_at, "placed_by": by, "placed_at": at}))
    await _journal(services, {
        "kind": "hold", "holdId": str(hold_id), "tenantId": principal.tenant, "scope": scope,
        "caseId": case_id and str(case_id), "keyField": stored and stored[0],
        "keyValue": stored and stored[1], "reason": reason,
        "endsAt": ends_at and ends_at.isoformat(), "placedBy": by, "placedAt": at.isoformat(),
        "action": action})
    row = await services.retention.place_hold(hold_id, principal.tenant, scope, case_id,
                                              stored, reason, ends_at, by, at, action)
    return hold_json({**row, "active": True, "releases": []})


def hold_json(row: dict[str, Any]) -> dict[str, Any]:
    return {"holdId": str(row["hold_id"]), "scope": row["scope"],
            **({"caseId": str(row["case_id"])} if row["case_id"] else {}),
            **({"key": {"field": row["key_field"], "value": row["key_value"]}}
               if row["key_field"] else {}),
            "reason": row["reason"], "placedBy": row["placed_by"],
            "placedAt": row["placed_at"].isoformat(),
            "endsAt": row["ends_at"] and row["ends_at"].isoformat(),
            "active": row["active"], "releases": row["releases"]}


async def holds(services: CaseServices, principal: Principal, *, active_only: bool,
                case_id: uuid.UUID | None) -> list[dict[str, Any]]:
    if not (principal.allows(Scope.HOLDS) or principal.allows(Scope.READ)):
        raise Forbidden("reading holds needs 'holds:manage' or 'cases:read'")
    rows = await services.retention.holds(principal.tenant, active_only=active_only,
                                          case_id=case_id)
    return [hold_json(r) for r in rows]


async def release_hold(services: CaseServices, principal: Principal, hold_id: uuid.UUID,
                       reason: str) -> dict[str, Any]:
    """One person's release; the hold ends with the second person's."""
    _needs(principal, Scope.HOLDS)
    if principal.person is None:
        raise Forbidden("a person releases a hold (a key made with --person, or an OIDC "
                        "subject)")
    refuse_unstorable(reason, "body", "reason")
    row = await services.retention.hold(hold_id)
    if row is None or row["tenant_id"] != principal.tenant:
        raise NotFound(f"no hold {hold_id}")
    person, at = await person_of(services, principal), _now()
    action = _signed(services, release_object(hold_id, person, reason, at))
    await _journal(services, {"kind": "release", "holdId": str(hold_id), "person": person,
                              "reason": reason, "releasedAt": at.isoformat(),
                              "action": action})
    try:
        released_by = await services.retention.release(hold_id, person, reason, at, action)
    except Taken as exc:
        raise Conflict(str(exc)) from exc
    return {"holdId": str(hold_id), "releasedBy": released_by,
            "released": len(released_by) >= 2}
