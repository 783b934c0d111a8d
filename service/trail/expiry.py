"""The verdict on an expired case (docs/design.md, "Keeping records as long as the law
says"): its events are gone by policy, its leaves are not. What remains is the signed
``CASE_EXPIRED`` and its tombstone; together with the log they prove what was there.

The checks, no I/O:

- exactly one stored event remains, the tombstone's ``CASE_EXPIRED``, and it verifies
  (hash, signature under a registered key, chained on the last attempt's final hash);
- the tombstone says what the signed event says (policy, version, events removed,
  chain heads);
- the log holds exactly ``eventsRemoved`` other leaves of the case, and each chain head
  the event names is one of them, with the hash it names.

A problem here is tampering after (or instead of) expiry; a case that verifies is
reported ``expired``, never ``removed_after_logging``.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from pydantic import ValidationError

from casetrail.contract.events import CaseExpiredPayload
from casetrail.trail.verification import (
    Problem,
    PublicKey,
    Report,
    TrailEvent,
    check_signed,
)


def verify_expired(case_id: uuid.UUID, stored: Sequence[tuple[uuid.UUID, TrailEvent]],
                   keys: Mapping[str, PublicKey], tombstone: Mapping[str, Any],
                   leaves: Mapping[uuid.UUID, tuple[int, str | None]]) -> Report:
    """``stored``: the case's events still stored (id and event); ``leaves``: each of
    its leaves by event id (index, hash); ``tombstone``: its row."""
    report = Report(str(case_id), complete=True)
    problems = report.problems
    expired_id = tombstone["event_id"]
    kept = [event for event_id, event in stored if event_id == expired_id]
    for event_id, event in stored:
        if event_id != expired_id:
            problems.append(Problem(event.attempt, event.seq, "after_expiry",
                                    "an event is stored beside the tombstone's CASE_EXPIRED"))
    if not kept:
        problems.append(Problem(None, None, "removed_after_logging",
                                "the case's CASE_EXPIRED is no longer stored"))
        return report
    event = kept[0]
    report.events = 1
    payload = _signed_payload(event, problems)
    if payload is None:
        return report
    check_signed(event, payload.heads[-1].hash, keys, problems)
    last = payload.heads[-1]
    if (event.attempt, event.seq) != (last.attempt, last.seq + 1):
        problems.append(Problem(event.attempt, event.seq, "broken_link",
                                "CASE_EXPIRED does not follow the last chain head it names"))
    _against_tombstone(payload, tombstone, problems)
    _against_log(payload, expired_id, event, leaves, problems)
    report.expired = {"policyId": payload.policy_id, "policyVersion": payload.policy_version,
                      "eventsRemoved": payload.events_removed,
                      "expiredAt": tombstone["expired_at"].isoformat(),
                      "expiredBy": payload.expired_by}
    report.attempts = [{"attempt": h.attempt, "events": h.seq + 1, "headHash": h.hash,
                        "ended": True} for h in payload.heads]
    return report


def _signed_payload(event: TrailEvent, problems: list[Problem]) -> CaseExpiredPayload | None:
    try:  # the signed bytes: what the event says, before any check of them
        envelope = orjson.loads(event.body or b"")
        if envelope.get("eventType") != "CASE_EXPIRED":
            raise ValueError("not a CASE_EXPIRED")
        return CaseExpiredPayload.model_validate(envelope.get("payload"))
    except (ValueError, AttributeError, ValidationError) as exc:
        problems.append(Problem(event.attempt, event.seq, "malformed",
                                f"the tombstone's event is not a readable CASE_EXPIRED: {exc}"))
        return None


def _against_tombstone(payload: CaseExpiredPayload, tombstone: Mapping[str, Any],
                       problems: list[Problem]) -> None:
    said = (payload.policy_id, payload.policy_version, payload.events_removed,
            [h.model_dump(mode="json", by_alias=True) for h in payload.heads])
    kept = (tombstone["policy_id"], tombstone["policy_version"], tombstone["events_removed"],
            list(tombstone["heads"]))
    if said != kept:
        problems.append(Problem(None, None, "tombstone_mismatch",
                                "the tombstone does not say what the signed CASE_EXPIRED says"))


def _against_log(payload: CaseExpiredPayload, expired_id: uuid.UUID, event: TrailEvent,
                 leaves: Mapping[uuid.UUID, tuple[int, str | None]],
                 problems: list[Problem]) -> None:
    others = {k: v for k, v in leaves.items() if k != expired_id}
    if len(others) != payload.events_removed:
        problems.append(Problem(None, None, "leaves_unaccounted",
                                f"the log holds {len(others)} other events of the case; its "
                                f"CASE_EXPIRED says {payload.events_removed} were removed"))
    for head in payload.heads:
        leaf = others.get(head.event_id)
        if leaf is None or leaf[1] != head.hash:
            problems.append(Problem(head.attempt, head.seq, "head_not_logged",
                                    "a chain head the expiry names is not a leaf of the log "
                                    "with that hash"))
    own = leaves.get(expired_id)
    if own is not None and event.integrity is not None and own[1] != event.integrity.hash:
        problems.append(Problem(event.attempt, event.seq, "altered",
                                "the stored CASE_EXPIRED differs from its leaf"))
