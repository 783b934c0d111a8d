"""A case's trail as evidence: verified against the registered keys, or exported as an
offline bundle that ``verify-bundle`` checks with nothing but the file and trusted keys.

The bundle (``"format": "casetrail-bundle/1"``, described in docs/bundle.md):

    {"format": "casetrail-bundle/1", "caseId": ..., "tenantId": ..., "exportedAt": ...,
     "case": {"status": ..., "agent": ...},
     "events": [{"attempt": 1, "seq": 0, "body": "<the signed bytes as UTF-8 text>",
                 "integrity": {"prevHash", "hash", "keyId", "sig"}}, ...],
     "keys": [{"keyId", "publicKey", "createdAt", "retiredAt", "notValidAfter"}]}
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from service.events import ENDED_STATUSES
from service.integrity import Integrity, IntegrityError, key_id, public_key_from_text
from service.store import CaseStore, KeyRegistry, StoredEvent
from service.verification import PublicKey, Report, TrailEvent, checked_at, verify_trail

BUNDLE_FORMAT = "casetrail-bundle/1"


class BundleError(ValueError):
    """A file that is not a readable bundle (``verify-bundle`` exits 2)."""


def trail_events(stored: Iterable[StoredEvent]) -> list[TrailEvent]:
    return [TrailEvent(e.attempt, e.seq, e.schema_version, e.body, e.integrity, e.columns())
            for e in stored]


@dataclass(frozen=True)
class Evidence:
    """Reads and checks trails for the API and the command line."""

    store: CaseStore
    keys: KeyRegistry

    async def verify(self, case_id: uuid.UUID, row: dict[str, Any] | None = None
                     ) -> Report | None:
        """The verdict on a case's stored trail; ``None`` for an unknown case."""
        row = row or await self.store.get_case(case_id)
        if row is None:
            return None
        stored = await self.store.find_by_case_and_types(case_id, with_body=True)
        keys = {k.key_id: k for k in await self.keys.all()}
        return verify_trail(str(case_id), trail_events(stored), keys,
                            case_ended=row["status"] in ENDED_STATUSES)

    async def integrity_summary(self, case_id: uuid.UUID, row: dict[str, Any]
                                ) -> dict[str, Any]:
        report = await self.verify(case_id, row)
        assert report is not None
        return {"verified": report.verified, "complete": report.complete,
                "checkedAt": checked_at()}

    async def bundle(self, case_id: uuid.UUID, row: dict[str, Any] | None = None
                     ) -> dict[str, Any] | None:
        """The case's bundle; ``None`` for an unknown case (``row``: already read)."""
        row = row or await self.store.get_case(case_id)
        if row is None:
            return None
        stored = await self.store.find_by_case_and_types(case_id, with_body=True)
        return {
            "format": BUNDLE_FORMAT,
            "caseId": str(case_id),
            "tenantId": row.get("tenant_id", "default"),
            "exportedAt": checked_at(),
            "case": {"status": row["status"], "agent": row["agent"]},
            "events": [
                {"attempt": e.attempt, "seq": e.seq,
                 "body": e.body.decode() if e.body is not None else None,
                 "integrity": e.integrity.as_json() if e.integrity else None}
                for e in stored
            ],
            "keys": await self.keys.describe(),
        }


def _stamp(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def verify_bundle(bundle: Any, trusted: Sequence[bytes]) -> Report:
    """Check a bundle against ``trusted`` public keys (32 raw bytes each) alone: the
    keys the bundle lists count only where they are trusted. ``BundleError`` when it is
    not a bundle at all."""
    if not isinstance(bundle, dict) or bundle.get("format") != BUNDLE_FORMAT:
        raise BundleError(f"not a {BUNDLE_FORMAT} file")
    case_id, events = bundle.get("caseId"), bundle.get("events")
    if not isinstance(case_id, str) or not isinstance(events, list):
        raise BundleError("a bundle needs caseId and a list of events")
    listed = {k.get("keyId"): k for k in bundle.get("keys") or [] if isinstance(k, dict)}
    keys: dict[str, PublicKey] = {}
    for raw in trusted:
        kid = key_id(raw)
        entry = listed.get(kid) or {}
        keys[kid] = PublicKey(kid, raw, _stamp(entry.get("notValidAfter")))
    trail: list[TrailEvent] = []
    for index, item in enumerate(events):
        if not isinstance(item, dict) or not isinstance(item.get("attempt"), int) \
                or not isinstance(item.get("seq"), int):
            raise BundleError(f"events[{index}] needs an integer attempt and seq")
        body, integrity = item.get("body"), None
        if item.get("integrity") is not None:
            try:
                integrity = Integrity.from_json(item["integrity"])
            except IntegrityError as exc:
                raise BundleError(f"events[{index}]: {exc}") from None
        trail.append(TrailEvent(item["attempt"], item["seq"], 2 if integrity else 1,
                                body.encode() if isinstance(body, str) else None, integrity))
    status = (bundle.get("case") or {}).get("status")
    return verify_trail(case_id, trail, keys, case_ended=status in ENDED_STATUSES)


def trusted_key(text_or_path: str) -> bytes:
    """A ``--trust`` value: a base64 public key, or a file holding one."""
    from pathlib import Path

    path = Path(text_or_path)
    text = path.read_text() if path.is_file() else text_or_path
    try:
        return public_key_from_text(text)
    except IntegrityError as exc:
        raise BundleError(f"--trust {text_or_path!r}: {exc}") from None
