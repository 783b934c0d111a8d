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

import logging
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

from casetrail.adapters.store import CaseStore, KeyRegistry, StoredEvent
from casetrail.adapters.store.ledger import LedgerStore
from casetrail.contract.events import ENDED_STATUSES
from casetrail.contract.integrity import Integrity, IntegrityError, key_id, public_key_from_text
from casetrail.ledger.note import TlogProof, Verifier
from casetrail.ledger.proofs import LoggedEvent, check_log
from casetrail.telemetry import metrics
from casetrail.trail.expiry import verify_expired
from casetrail.trail.projection import project
from casetrail.trail.verification import (
    Problem,
    PublicKey,
    Report,
    TrailEvent,
    checked_at,
    verify_trail,
)

BUNDLE_FORMAT = "casetrail-bundle/1"

log = logging.getLogger("casetrail.audit")


class BundleError(ValueError):
    """A file that is not a readable bundle (``verify-bundle`` exits 2)."""


def integrity_summary(report: Report) -> dict[str, Any]:
    """What a case's view says of its trail (``IntegritySummary``): the verdict, and the
    problems' codes when it does not verify (``projection_mismatch``: a value shown is
    not the signed one)."""
    return {"verified": report.verified, "complete": report.complete,
            "checkedAt": checked_at(),
            **({"problems": sorted({p.code for p in report.problems})}
               if report.problems else {})}


def served_mismatch(case_id: uuid.UUID, row: Mapping[str, Any], trail: Sequence[TrailEvent]
                    ) -> list[Problem]:
    """A ``projection_mismatch`` when the row shows other values than its trail's signed
    bytes say (casetrail.trail.projection); logged and counted wherever it is read."""
    differing = project(_signed_payloads(trail)).differences(row)
    if not differing:
        return []
    log.error("case %s: the case row's %s are not what its signed trail says",
              case_id, ", ".join(differing))
    metrics.PROJECTION_MISMATCHES.inc()
    return [Problem(None, None, "projection_mismatch",
                    f"the case's {', '.join(differing)} as stored (and shown) are not what "
                    "its signed trail says")]


def _signed_payloads(trail: Iterable[TrailEvent]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each event's type and payload from its signed bytes (the queried columns for an
    event stored before signing, which has none)."""
    for event in trail:
        if event.body is None:
            yield event.columns.get("eventType", ""), event.columns.get("payload") or {}
            continue
        try:
            envelope = orjson.loads(event.body)
        except orjson.JSONDecodeError:
            continue  # verification names it (hash_mismatch, unreadable)
        if isinstance(envelope, dict) and isinstance(envelope.get("payload"), dict):
            yield str(envelope.get("eventType")), envelope["payload"]


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

    async def verify(self, case_id: uuid.UUID) -> Report | None:
        """The verdict on a case's stored trail; ``None`` for a case neither stored nor
        in the log."""
        return (await self.checked(case_id))[1]

    async def checked(self, case_id: uuid.UUID,
                      visible: Callable[[Mapping[str, Any]], bool] | None = None
                      ) -> tuple[dict[str, Any] | None, Report | None]:
        """The case's row and the verdict on it: its trail, and what the row shows
        against what the trail says (``projection_mismatch``), both read as of one
        moment. Show that row, never one read before: it is the one checked. A row
        ``visible`` refuses is returned unchecked (``None``: nothing verified for it)."""
        row, stored = await self.store.case_and_trail(case_id)
        if row is not None and visible is not None and not visible(row):
            return row, None
        if row is None and (tombstone := await self.store.tombstone(case_id)) is not None:
            return None, await self._verify_expired(case_id, tombstone)
        logged = await self.ledger.leaves_of_case(case_id) if self.ledger else {}
        if row is None:
            if not logged:
                return None, None
            report = Report(str(case_id))
            report.problems.append(Problem(None, None, "removed_after_logging",
                                           f"the log holds {len(logged)} events of this case "
                                           "(leaves " + _leaves(logged.values()) + ") but the "
                                           "case is not stored"))
            return None, report
        signing, actions = await self.keys.with_action_keys()
        trail = trail_events(stored)
        report = verify_trail(str(case_id), trail,
                              {k.key_id: k for k in signing},
                              case_ended=row["status"] in ENDED_STATUSES,
                              action_keys={k.key_id: k for k in actions})
        if not report.problems:  # a broken trail says nothing a row could be held to
            report.problems += served_mismatch(case_id, row, trail)
        gone = logged.keys() - {e.event_id for e in stored}
        if gone:
            report.problems.append(Problem(None, None, "removed_after_logging",
                                           f"{len(gone)} events of this case are in the log "
                                           "(leaves " + _leaves(logged[e] for e in gone)
                                           + ") but no longer stored"))
        return row, report

    async def _verify_expired(self, case_id: uuid.UUID, tombstone: dict[str, Any]
                              ) -> Report:
        """An expired case: its CASE_EXPIRED against its tombstone and the log."""
        stored = await self.store.find_by_case_and_types(case_id, with_body=True)
        leaves = await self.ledger.leaf_hashes_of_case(case_id) if self.ledger else {}
        signing = await self.keys.all()
        return verify_expired(case_id, [(e.event_id, t) for e, t in
                                        zip(stored, trail_events(stored), strict=True)],
                              {k.key_id: k for k in signing}, tombstone, leaves)


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
        leaves = await self.ledger.leaves_of_case(case_id)
        # The earliest witnessed checkpoint holding every leaf of the case, where there
        # is one: its cosignature's time is when the trail was known to exist (what
        # shows events signed before a key's retirement); `verify-bundle --log` shows
        # today's log still extends it.
        needed = max((i + 1 for i in leaves.values() if i < latest.size), default=0)
        chosen = (await self.ledger.first_cosigned_covering(needed) if needed else None) \
            or latest
        note = chosen.served
        logged = [(e.event_id, leaves[e.event_id]) for e in stored
                  if leaves.get(e.event_id, chosen.size) < chosen.size]
        paths = await self.ledger.inclusions([i for _, i in logged], chosen.size)
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


@dataclass(frozen=True)
class TrustedKey:
    """A signing key an auditor trusts, and until when (their word, never the bundle's)."""

    public_key: bytes
    not_valid_after: datetime | None = None


def verify_bundle(bundle: Any, trusted: Sequence[bytes | TrustedKey],
                  log_keys: Sequence[Verifier] = (),
                  witnesses: Sequence[Verifier] = (),
                  action_keys: Sequence[bytes] | None = None) -> Report:
    """Check a bundle against ``trusted`` public keys alone: nothing the bundle says of
    its keys (a ``notValidAfter`` included) counts. Its log proofs are always checked
    against its checkpoint; with ``log_keys`` the checkpoint must be signed by one and
    every event logged, with ``witnesses`` cosigned by each; with ``action_keys`` every
    person's action must be signed by one of them (without, their signatures are not
    checked and the report warns so).

    An event signed with a key the auditor trusts only until a time verifies only when a
    trusted witness cosigned a checkpoint that includes it before that time (C2SP
    checkpoints carry no time; cosignatures do). The event's own ``occurredAt`` is the
    signer's word, and is never evidence of when it was signed. ``BundleError`` when it
    is not a bundle at all."""
    if not isinstance(bundle, dict) or bundle.get("format") != BUNDLE_FORMAT:
        raise BundleError(f"not a {BUNDLE_FORMAT} file")
    case_id, events = bundle.get("caseId"), bundle.get("events")
    if not isinstance(case_id, str) or not isinstance(events, list):
        raise BundleError("a bundle needs caseId and a list of events")
    trust = [t if isinstance(t, TrustedKey) else TrustedKey(t) for t in trusted]
    keys = {key_id(t.public_key): PublicKey(key_id(t.public_key), t.public_key)
            for t in trust}
    limits = {key_id(t.public_key): t.not_valid_after for t in trust
              if t.not_valid_after is not None}
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
    report = verify_trail(case_id, trail, keys, case_ended=status in ENDED_STATUSES,
                          action_keys=None if action_keys is None else {
                              key_id(k): PublicKey(key_id(k), k) for k in action_keys})
    log = bundle.get("log")
    checkpoint = log.get("checkpoint") if isinstance(log, dict) else None
    checkpoint = checkpoint if isinstance(checkpoint, str) else None
    check = check_log(checkpoint, logged, log_keys, witnesses)
    report.problems.extend(check.problems)
    report.problems.extend(signed_while_valid(trail, limits, check.included,
                                               check.cosigned_at))
    report.log = check.as_json()
    return report


def signed_while_valid(trail: Sequence[TrailEvent], limits: dict[str, datetime],
                        included: set[tuple[int, int]], cosigned_at: Sequence[int]
                        ) -> list[Problem]:
    """A ``retired_key`` problem for each event signed with a key trusted only until a
    time, unless a trusted witness cosigned a checkpoint holding it before then."""
    witnessed = datetime.fromtimestamp(min(cosigned_at), UTC) if cosigned_at else None
    problems = []
    for event in trail:
        kid = event.integrity.key_id if event.integrity else None
        limit = limits.get(kid) if kid else None
        if limit is None:
            continue
        if witnessed is not None and witnessed < limit \
                and (event.attempt, event.seq) in included:
            continue
        problems.append(Problem(event.attempt, event.seq, "retired_key",
                                f"signed with key {kid}, which you trust only until "
                                f"{limit.isoformat()}, and no trusted witness cosigned a "
                                "checkpoint holding it before then"))
    return problems


def trusted_keys(text_or_path: str) -> list[TrustedKey]:
    """A ``--trust`` value: ``KEY[@NOT_VALID_AFTER]`` (a base64 public key, an ISO 8601
    time), or a trust file holding one such entry a line (``#`` starts a comment)."""
    from pathlib import Path

    path = Path(text_or_path)
    lines = path.read_text().splitlines() if path.is_file() else [text_or_path]
    entries = [line.split("#", 1)[0].strip() for line in lines]
    found = []
    for entry in filter(None, entries):
        key_text, _, until = entry.partition("@")
        limit = _stamp(until) if until else None
        if until and limit is None:
            raise BundleError(f"--trust {entry!r}: {until!r} is not an ISO 8601 time")
        try:
            found.append(TrustedKey(public_key_from_text(key_text), limit))
        except IntegrityError as exc:
            raise BundleError(f"--trust {entry!r}: {exc}") from None
    if not found:
        raise BundleError(f"--trust {text_or_path!r}: no key in it")
    return found
