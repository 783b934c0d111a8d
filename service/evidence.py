"""A case's trail as evidence: verified against the registered keys, or exported as an
offline bundle that ``verify-bundle`` checks with nothing but the file and trusted keys.

The bundle (``"format": "casetrail-bundle/1"``, described in docs/bundle.md):

    {"format": "casetrail-bundle/1", "caseId": ..., "tenantId": ..., "exportedAt": ...,
     "case": {"status": ..., "agent": ...},
     "events": [{"attempt": 1, "seq": 0, "body": "<the signed bytes as UTF-8 text>",
                 "integrity": {"prevHash", "hash", "keyId", "sig"}}, ...],
     "keys": [{"keyId", "publicKey", "createdAt", "retiredAt", "notValidAfter"}],
     "log": {"checkpoint": "<signed note>", "verifierKeys": [...]}}

Each event logged by the checkpoint also carries ``"logProof"``: its C2SP ``tlog-proof``
(leaf index, inclusion path, the checkpoint verbatim); docs/bundle.md has the formats.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from service.events import ENDED_STATUSES
from service.integrity import Integrity, IntegrityError, key_id, public_key_from_text
from service.ledger.note import TlogProof, Verifier
from service.ledger.proofs import LoggedEvent, check_log
from service.ledger.store import LedgerStore
from service.store import CaseStore, KeyRegistry, StoredEvent
from service.verification import (
    Problem,
    PublicKey,
    Report,
    TrailEvent,
    checked_at,
    verify_trail,
)

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
    ledger: LedgerStore | None = None
    """The transparency log: events it holds must still be stored."""

    async def verify(self, case_id: uuid.UUID, row: dict[str, Any] | None = None
                     ) -> Report | None:
        """The verdict on a case's stored trail; ``None`` for a case neither stored nor
        in the log."""
        row = row or await self.store.get_case(case_id)
        logged = await self.ledger.leaves_of_case(case_id) if self.ledger else {}
        if row is None:
            if not logged:
                return None
            report = Report(str(case_id))
            report.problems.append(Problem(None, None, "removed_after_logging",
                                           f"the log holds {len(logged)} events of this case "
                                           "(leaves " + _leaves(logged.values()) + ") but the "
                                           "case is not stored"))
            return report
        stored = await self.store.find_by_case_and_types(case_id, with_body=True)
        keys = {k.key_id: k for k in await self.keys.all()}
        report = verify_trail(str(case_id), trail_events(stored), keys,
                              case_ended=row["status"] in ENDED_STATUSES)
        gone = logged.keys() - {e.event_id for e in stored}
        if gone:
            report.problems.append(Problem(None, None, "removed_after_logging",
                                           f"{len(gone)} events of this case are in the log "
                                           "(leaves " + _leaves(logged[e] for e in gone)
                                           + ") but no longer stored"))
        return report

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
        proofs, log = await self._log_proofs(case_id, stored)
        return {
            "format": BUNDLE_FORMAT,
            "caseId": str(case_id),
            "tenantId": row.get("tenant_id", "default"),
            "exportedAt": checked_at(),
            "case": {"status": row["status"], "agent": row["agent"]},
            "events": [
                {"attempt": e.attempt, "seq": e.seq,
                 "body": e.body.decode() if e.body is not None else None,
                 "integrity": e.integrity.as_json() if e.integrity else None,
                 **({"logProof": proofs[e.event_id]} if e.event_id in proofs else {})}
                for e in stored
            ],
            "keys": await self.keys.describe(),
            **({"log": log} if log else {}),
        }

    async def _log_proofs(self, case_id: uuid.UUID, stored: Sequence[StoredEvent]
                          ) -> tuple[dict[uuid.UUID, str], dict[str, Any] | None]:
        """Each logged event's tlog-proof in the latest checkpoint, and the log's part."""
        if self.ledger is None:
            return {}, None
        latest = await self.ledger.latest()
        if latest is None:
            return {}, None
        note = latest.served
        leaves = await self.ledger.leaves_of_case(case_id)
        logged = [(e.event_id, leaves[e.event_id]) for e in stored
                  if leaves.get(e.event_id, latest.size) < latest.size]
        paths = await self.ledger.inclusions([i for _, i in logged], latest.size)
        proofs = {event_id: TlogProof(index, tuple(path), note).render()
                  for (event_id, index), path in zip(logged, paths, strict=True)}
        return proofs, {"checkpoint": note, "verifierKeys": await self.ledger.verifier_keys()}


def _stamp(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _leaves(indexes: Iterable[int]) -> str:
    ordered = sorted(indexes)
    return ", ".join(map(str, ordered[:5])) + (" …" if len(ordered) > 5 else "")


def verify_bundle(bundle: Any, trusted: Sequence[bytes], log_keys: Sequence[Verifier] = (),
                  witnesses: Sequence[Verifier] = ()) -> Report:
    """Check a bundle against ``trusted`` public keys (32 raw bytes each) alone: the
    keys the bundle lists count only where they are trusted. Its log proofs are always
    checked against its checkpoint; with ``log_keys`` the checkpoint must be signed by one
    and every event logged, with ``witnesses`` cosigned by each. ``BundleError`` when it
    is not a bundle at all."""
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
    logged: list[LoggedEvent] = []
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
        proof = item.get("logProof")
        logged.append(LoggedEvent(item["attempt"], item["seq"],
                                  integrity.hash if integrity else None,
                                  proof if isinstance(proof, str) else None))
    status = (bundle.get("case") or {}).get("status")
    report = verify_trail(case_id, trail, keys, case_ended=status in ENDED_STATUSES)
    log = bundle.get("log")
    checkpoint = log.get("checkpoint") if isinstance(log, dict) else None
    checkpoint = checkpoint if isinstance(checkpoint, str) else None
    check = check_log(checkpoint, logged, log_keys, witnesses)
    report.problems.extend(check.problems)
    report.log = check.as_json()
    return report


def trusted_key(text_or_path: str) -> bytes:
    """A ``--trust`` value: a base64 public key, or a file holding one."""
    from pathlib import Path

    path = Path(text_or_path)
    text = path.read_text() if path.is_file() else text_or_path
    try:
        return public_key_from_text(text)
    except IntegrityError as exc:
        raise BundleError(f"--trust {text_or_path!r}: {exc}") from None
