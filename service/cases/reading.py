"""Reading cases: one case (its view, its trail, its verdict, its bundle) within the
caller's tenant, and the tenant's cases by search. Sensitive values are shown in clear
only to ``pii:read`` callers, and each such read (and each export) is logged."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from casetrail.adapters.store import principal_names, utc_text
from casetrail.adapters.store.search import CaseFilter, Cursor, case_summary
from casetrail.agents import AGENTS
from casetrail.audit.evidence import integrity_summary
from casetrail.cases.errors import Expired, Forbidden, Invalid, Issue, NotFound, OverQuota
from casetrail.cases.services import CaseServices
from casetrail.cases.text import refuse_unstorable
from casetrail.contract.auth import Principal, Scope
from casetrail.contract.events import EVENT_TYPES, CaseStatus
from casetrail.errors import PermanentError
from casetrail.privacy.sensitive import restore, sensitive_field
from casetrail.telemetry import metrics
from casetrail.trail.verification import Report

log = logging.getLogger("casetrail.cases")


async def owned(services: CaseServices, principal: Principal, case_id: uuid.UUID
                ) -> dict[str, Any]:
    """The case's row, if it is the caller's to see: another tenant's case is not
    found, so its existence is not confirmed."""
    row = await services.store.get_case(case_id)
    if row is None and (gone := await services.store.tombstone(case_id)) is not None \
            and principal.sees(gone["tenant_id"]):
        await _expired(services, case_id, gone)
    if row is None or not principal.sees(row["tenant_id"]):
        raise NotFound(f"no case {case_id}")
    return row


async def _expired(services: CaseServices, case_id: uuid.UUID, gone: Mapping[str, Any]
                   ) -> None:
    """Raise ``Expired`` (410) for a case whose tombstone its signed ``CASE_EXPIRED``
    vouches for. A tombstone alone is anybody's row: without that event verifying, the
    case is not found, and the answer says why (docs/design.md, "Keeping records as long
    as the law says")."""
    report = await services.evidence.verify(case_id)
    if report is not None and report.verified and report.expired is not None:
        raise Expired(
            f"case {case_id} expired on {utc_text(gone['expired_at'])} under retention "
            f"policy {gone['policy_id']} version {gone['policy_version']} "
            f"({gone['events_removed']} events removed, by {gone['expired_by']}); its "
            f"CASE_EXPIRED and tombstone remain: GET /cases/{case_id}/verify checks them")
    codes = sorted({p.code for p in report.problems}) if report is not None else []
    log.error("case %s has a tombstone but no signed CASE_EXPIRED that verifies it (%s): "
              "not answered as expired", case_id, ", ".join(codes) or "no events")
    metrics.EXPIRIES_UNVERIFIED.inc()
    raise NotFound(f"no case {case_id}: a tombstone stands for it, but no signed "
                   f"CASE_EXPIRED verifies it ({', '.join(codes) or 'no events'}); "
                   f"GET /cases/{case_id}/verify says why")


def case_view(row: dict[str, Any]) -> dict[str, Any]:
    """A case as the API shows it (``CaseView``), from its row."""
    return case_summary(row) | {
        "answer": row["answer"],
        "outcome": row["outcome"],
        "input": row["input"],
        "model": row["model"],
        "limits": row["limits"],
        "cancelRequested": row["cancel_requested_at"] is not None,
        "startedBy": row["started_by"],
        "startedAt": utc_text(row["started_at"]),
    }


async def sensitive_values(services: CaseServices, principal: Principal,
                           case: dict[str, Any]) -> tuple[dict[str, str], dict[str, Any] | None]:
    """The values to show in clear (only with ``pii:read``; the read is logged) and the
    summary of the case's sensitive input (``None``: it has none)."""
    case_id = case["case_id"]
    state = await services.secrets.state(case_id)
    if state is None:
        return {}, None
    values: dict[str, str] = {}
    if principal.allows(Scope.PII_READ) and state.sealed is not None:
        try:
            values = services.secrets.vault.open(case_id, state.sealed)
        except PermanentError as exc:  # sealed under another master key
            log.error("case %s: sensitive values not opened: %s", case_id, exc)
        else:
            await services.secrets.log_access(principal.subject, case["tenant_id"], case_id,
                                              "pii:read")
    return values, {
        "placeholders": list(state.placeholders), "shownInClear": bool(values),
        "erasedAt": utc_text(state.erased_at), "erasedBy": state.erased_by}


async def status(services: CaseServices, principal: Principal, case_id: uuid.UUID
                 ) -> dict[str, Any]:
    """The case as a list shows it (status, agent, totals; no answer, no integrity): one
    row read, for a caller polling a case that has not ended."""
    return case_summary(await owned(services, principal, case_id))


async def checked(services: CaseServices, principal: Principal, case_id: uuid.UUID
                  ) -> tuple[dict[str, Any], Report]:
    """The case's row, if it is the caller's to see, read again with its trail as of one
    moment and checked against it: the row to show (docs/design.md, "Served values")."""
    row, report = await services.evidence.checked(
        case_id, lambda found: principal.sees(found["tenant_id"]))
    if row is None or report is None:
        await owned(services, principal, case_id)  # expired (410), or not the caller's
        raise NotFound(f"no case {case_id}")
    return row, report


async def get(services: CaseServices, principal: Principal, case_id: uuid.UUID
              ) -> dict[str, Any]:
    """The case: status, totals, answer, its trail's integrity and its sensitive input."""
    row, report = await checked(services, principal, case_id)
    view = case_view(row)
    view["startedByName"] = (await principal_names(services.pool, [row["started_by"]])).get(
        row["started_by"])
    view["integrity"] = integrity_summary(report)
    view["held"] = await services.retention.held(case_id, row["tenant_id"])
    values, view["sensitive"] = await sensitive_values(services, principal, row)
    shown: dict[str, Any] = restore(view, values)
    return shown


async def events(services: CaseServices, principal: Principal, case_id: uuid.UUID,
                 types: list[str] | None = None) -> dict[str, Any]:
    """The case's trail in (attempt, seq) order, only ``types`` when given."""
    unknown = [t for t in types or () if t not in EVENT_TYPES]
    if unknown:
        raise Invalid(Issue(("query", "types"), f"unknown event types {unknown}; known: "
                                                f"{', '.join(EVENT_TYPES)}"))
    row = await owned(services, principal, case_id)
    found = await services.store.find_by_case_and_types(case_id, types or None)
    values, _ = await sensitive_values(services, principal, row)
    return {"caseId": str(case_id), "events": [restore(e.as_json(), values) for e in found]}


def instant(text: str | None, name: str) -> datetime | None:
    """An RFC 3339 date-time with its offset (``name``: the query parameter)."""
    if text is None:
        return None
    try:
        # Python's parser takes six fractional digits at most; RFC 3339 allows more.
        head, dot, rest = text.partition(".")
        if dot:
            digits = len(rest) - len(rest.lstrip("0123456789"))
            text = f"{head}.{rest[:min(digits, 6)]}{rest[digits:]}"
        return datetime.fromisoformat(text.upper())
    except ValueError as exc:
        raise Invalid(Issue(("query", name), f"not an RFC 3339 date-time: {exc}")) from None


async def search(services: CaseServices, principal: Principal, *, agent: str | None = None,
                 status: CaseStatus | None = None, decision: str | None = None,
                 since: str | None = None, until: str | None = None, limit: int = 50,
                 cursor: str | None = None, checks: str | None = None,
                 key: str | None = None, keyed: Mapping[str, str] | None = None,
                 ) -> dict[str, Any]:
    """A page of the tenant's cases, newest first, and the next page's cursor."""
    refuse_unstorable(agent, "query", "agent")
    refuse_unstorable(decision, "query", "decision")
    try:
        after = Cursor.decode(cursor) if cursor is not None else None
    except ValueError as exc:
        raise Invalid(Issue(("query", "cursor"), f"not a cursor of this API: {exc}")) from None
    if checks not in (None, "failed"):
        raise Invalid(Issue(("query", "checks"), "only 'failed' (cases where a check failed)"))
    if key is not None or keyed:
        wait = services.key_searches.admit(principal.tenant)
        if wait is not None:
            raise OverQuota(f"tenant {principal.tenant!r} searched by key "
                            f"{services.settings.tenant_max_key_searches_per_minute} times in "
                            "the last minute", wait)
    wanted = CaseFilter(principal.tenant, agent, status, decision, instant(since, "since"),
                        instant(until, "until"), checks_failed=checks == "failed" or None,
                        keys=_key_filters(services, principal, key, keyed or {}))
    items, following = await services.index.search(wanted, limit, after)
    return {"items": items, "nextCursor": following.encode() if following else None}


MAX_KEY_LENGTH = 300
"""The longest business key kept or searched (``case_keys.value``)."""


def _key_filters(services: CaseServices, principal: Principal, key: str | None,
                 keyed: Mapping[str, str]) -> tuple[tuple[str | None, tuple[str, ...]], ...]:
    """What a case's kept keys must hold: the value itself, or the keyed digest a
    sensitive field's value is kept as. Searching a sensitive field needs ``pii:read``
    (else a caller who sees only placeholders could probe which case holds a value);
    without it a bare ``key`` searches the other fields alone."""
    fields = sorted({field for agent in AGENTS.values() for field in agent.keys})
    sensitive = {field for agent in AGENTS.values() for field in agent.keys
                 if sensitive_field(agent.input_model, field)}
    reads_pii = principal.allows(Scope.PII_READ)
    vault = services.secrets.vault
    found: list[tuple[str | None, tuple[str, ...]]] = []
    for name, value in keyed.items():
        if len(value) > MAX_KEY_LENGTH:
            raise Invalid(Issue(("query", f"key.{name}"), f"at most {MAX_KEY_LENGTH} "
                                "characters"))
        if name not in fields:
            raise Invalid(Issue(("query", f"key.{name}"), f"no agent has a key {name!r}; the "
                                f"keys are: {', '.join(fields) or 'none'}"))
        if name in sensitive and not reads_pii:
            raise Forbidden(f"searching by key.{name} needs the scope 'pii:read': {name} is "
                            "a sensitive field")
        found.append((name, (value, vault.key_digest(name, value))))
    if key is not None:
        found.append((None, (key, *(vault.key_digest(f, key) for f in fields
                                    if reads_pii or f not in sensitive))))
    for name, value in [*keyed.items(), *([("key", key)] if key is not None else [])]:
        refuse_unstorable(value, "query", name if name == "key" else f"key.{name}")
    return tuple(found)


async def verify(services: CaseServices, principal: Principal, case_id: uuid.UUID) -> Report:
    """The verdict on the case's trail: every chain, signature and its completeness; for
    an expired case, its ``CASE_EXPIRED`` against its tombstone and the log's leaves."""
    row = await services.store.get_case(case_id)
    if row is None and (tombstone := await services.store.tombstone(case_id)) is not None \
            and principal.sees(tombstone["tenant_id"]):
        report = await services.evidence.verify(case_id)
    elif row is None or not principal.sees(row["tenant_id"]):
        raise NotFound(f"no case {case_id}")
    else:
        report = await services.evidence.verify(case_id)
    assert report is not None  # the case exists, or expired
    return report


async def export(services: CaseServices, principal: Principal, case_id: uuid.UUID
                 ) -> dict[str, Any]:
    """The case's offline bundle; the export is logged (who, when, which case)."""
    row = await owned(services, principal, case_id)
    bundle = await services.evidence.bundle(case_id, row)
    assert bundle is not None
    await services.secrets.log_access(principal.subject, row["tenant_id"], case_id, "export")
    return bundle
