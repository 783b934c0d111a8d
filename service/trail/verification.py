"""Whether a trail is intact: every attempt's chain, every signature, completeness.

No I/O: the API and ``casetrail verify`` give it the stored rows and the registered
keys, ``verify-bundle`` the events of a bundle and the keys it was told to trust.
Each problem names the attempt and seq it was found at and a machine-readable code:

    unsigned          a version-1 event (stored before signing existed)
    malformed         the signed bytes are not an event envelope
    hash_mismatch     the hash is not SHA-256(prevHash || 0x0A || body)
    broken_link       prevHash is not the previous event's hash (or zeros at seq 0)
    unknown_key       signed with a key that is not registered (or not trusted)
    retired_key       signed under a key after its not-valid-after time
    bad_signature     the signature does not verify under the key
    seq_gap           an attempt's seq does not run 0, 1, 2 ... (an event is missing)
    column_mismatch   a queried column (payload, event_type, ...) differs from the body
    missing_terminal  the case ended (or every attempt stopped) without its terminal event
    extra_terminal    more than one terminal event
    terminal_not_last the terminal event is not on the case's last attempt
    after_terminal    an event other than an administrative one (CASE_ERASED,
                      CASE_EXPIRED) after it
    after_parked      an event after CASE_AWAITING_REVIEW in the same attempt (the attempt
                      that waits for a person ends there; the next one goes on)
    bad_action        a person's action (a review, an answer) carries a malformed signed
                      action, or one for another case, person, verdict or text
    bad_action_signature  the action's signature does not hold under the action keys
                      (registered, or trusted: ``--trust-action``)

Warnings, which do not fail a trail: ``unsigned_action`` (a start, review or answer
recorded before persons' actions were signed), ``action_unchecked`` (no action keys were given
to check its signature against).

An attempt that ends with ``CASE_AWAITING_REVIEW`` is parked, not cut short: the case
waits for a person (``parked``), and its trail is complete so far.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

from casetrail.contract.events import (
    ADMINISTRATIVE_EVENT_TYPES,
    PARKING_EVENT_TYPE,
    TERMINAL_EVENT_TYPES,
)
from casetrail.contract.integrity import (
    GENESIS,
    Integrity,
    IntegrityError,
    chain_hash,
    signature_valid,
)
from casetrail.trail.person_actions import (
    SignedAction,
    answer_problem,
    erased_problem,
    review_problem,
    signature_problem,
    started_problem,
)


@dataclass(frozen=True)
class PublicKey:
    """A registered (or trusted) signing key and the time after which it signs nothing."""

    key_id: str
    public_key: bytes
    not_valid_after: datetime | None = None


@dataclass(frozen=True)
class TrailEvent:
    """One event as stored: its signed bytes and integrity, and the queried columns
    (``columns``, compared with the bytes; empty for a bundle, which has only bytes)."""

    attempt: int
    seq: int
    schema_version: int
    body: bytes | None
    integrity: Integrity | None
    columns: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Problem:
    attempt: int | None
    seq: int | None
    code: str
    message: str

    def as_json(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "seq": self.seq, "code": self.code,
                "message": self.message}


@dataclass
class Report:
    """The verdict on one case's trail."""

    case_id: str
    events: int = 0
    complete: bool = False
    attempts: list[dict[str, Any]] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    log: dict[str, Any] | None = None
    """What the transparency log's proofs showed (bundles)."""
    parked: bool = False
    """The last attempt ended waiting for a person (``CASE_AWAITING_REVIEW``)."""
    reviews: list[dict[str, Any]] = field(default_factory=list)
    """Who reviewed the case, from the signed ``CASE_REVIEWED`` events: reviewer,
    verdict, decision, when."""
    warnings: list[Problem] = field(default_factory=list)
    """What was not checked, or was recorded before it could be (never a failure)."""
    expired: dict[str, Any] | None = None
    """An expired case: what its CASE_EXPIRED and tombstone say (casetrail.trail.expiry)."""

    @property
    def verified(self) -> bool:
        return self.events > 0 and not self.problems

    def as_json(self) -> dict[str, Any]:
        return {"caseId": self.case_id, "verified": self.verified, "complete": self.complete,
                "events": self.events, "attempts": self.attempts,
                "problems": [p.as_json() for p in self.problems],
                **({"parked": True} if self.parked else {}),
                **({"reviews": self.reviews} if self.reviews else {}),
                **({"warnings": [w.as_json() for w in self.warnings]}
                   if self.warnings else {}),
                **({"log": self.log} if self.log is not None else {}),
                **({"expired": self.expired} if self.expired is not None else {})}

    def first_problem(self) -> str:
        if not self.problems:
            return "no events" if not self.events else "none"
        p = self.problems[0]
        where = f"attempt {p.attempt} seq {p.seq}: " if p.attempt is not None else ""
        return f"{where}{p.code}: {p.message}"


def _stamp(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
    return None


def check_signed(event: TrailEvent, prev_hash: str, keys: Mapping[str, PublicKey],
                  problems: list[Problem]) -> dict[str, Any] | None:
    """The checks on one signed event; its envelope when the body reads as one."""
    at, integrity, body = (event.attempt, event.seq), event.integrity, event.body
    assert integrity is not None and body is not None

    def problem(code: str, message: str) -> None:
        problems.append(Problem(*at, code, message))

    if integrity.prev_hash != prev_hash:
        problem("broken_link", f"prevHash {integrity.prev_hash[:12]}… does not follow "
                               f"{prev_hash[:12]}…")
    if chain_hash(integrity.prev_hash, body) != integrity.hash:
        problem("hash_mismatch", "the signed bytes do not hash to the recorded hash")
    key = keys.get(integrity.key_id)
    envelope: dict[str, Any] | None
    try:
        parsed = orjson.loads(body)
        envelope = parsed if isinstance(parsed, dict) else None
    except orjson.JSONDecodeError:
        envelope = None
    if envelope is None:
        problem("malformed", "the signed bytes are not a JSON envelope")
    if key is None:
        problem("unknown_key", f"key {integrity.key_id} is not registered or not trusted")
    else:
        occurred = _stamp(envelope.get("occurredAt")) if envelope else None
        if key.not_valid_after is not None and (occurred is None
                                                or occurred > key.not_valid_after):
            problem("retired_key", f"signed under key {key.key_id} after its not-valid-after "
                                   f"time {key.not_valid_after.isoformat()}")
        if not signature_valid(key.public_key, integrity.hash, integrity.sig):
            problem("bad_signature", f"the signature does not verify under key {key.key_id}")
    if envelope is not None:
        for name in ("attempt", "seq"):
            if envelope.get(name) != getattr(event, name):
                problem("column_mismatch", f"{name} is {getattr(event, name)} but the signed "
                                           f"event says {envelope.get(name)!r}")
        for name, value in event.columns.items():
            signed = envelope.get(name)
            same = _stamp(signed) == _stamp(value) if name == "occurredAt" else signed == value
            if not same:
                problem("column_mismatch", f"the stored {name} differs from the signed event")
    return envelope


def verify_trail(case_id: str, events: Iterable[TrailEvent], keys: Mapping[str, PublicKey],
                 *, case_ended: bool = False,
                 action_keys: Mapping[str, PublicKey] | None = None) -> Report:
    """Check ``events`` (any order) of one case; ``case_ended`` when the case's own record
    says it ended, so a missing terminal event is a problem even on a short trail.
    Persons' actions are checked against ``action_keys`` (``None``: their signatures are
    not checked, and the report says so)."""
    report = Report(case_id)
    by_attempt: dict[int, list[TrailEvent]] = {}
    for event in events:
        by_attempt.setdefault(event.attempt, []).append(event)
        report.events += 1
    terminals: list[tuple[int, int]] = []
    for attempt in sorted(by_attempt):
        chain = _Chain(report, attempt, keys, action_keys)
        for event in sorted(by_attempt[attempt], key=lambda e: e.seq):
            if chain.take(event) in TERMINAL_EVENT_TYPES:
                terminals.append((attempt, event.seq))
        report.attempts.append(chain.summary(len(by_attempt[attempt])))
    _check_ending(report, terminals, max(by_attempt, default=None), case_ended)
    report.problems.sort(key=lambda p: (p.attempt or 0, -1 if p.seq is None else p.seq))
    return report


@dataclass
class _Chain:
    """One attempt's events, taken in seq order: its chain, and where it ended or parked."""

    report: Report
    attempt: int
    keys: Mapping[str, PublicKey]
    action_keys: Mapping[str, PublicKey] | None
    prev_hash: str = GENESIS
    expected_seq: int = 0
    ended: bool = False
    parked: bool = False
    head: str | None = None

    def problem(self, seq: int, code: str, detail: str) -> None:
        self.report.problems.append(Problem(self.attempt, seq, code, detail))

    def take(self, event: TrailEvent) -> str | None:
        """Check ``event`` as the next of the chain; its type."""
        if event.seq != self.expected_seq:
            self.problem(event.seq, "seq_gap", _gap(self.expected_seq, event.seq))
        self.expected_seq = event.seq + 1
        event_type = self._signed_type(event)
        if self.ended and event_type not in ADMINISTRATIVE_EVENT_TYPES:
            self.problem(event.seq, "after_terminal", f"a {event_type} after the terminal "
                         "event")
        elif self.parked:
            self.problem(event.seq, "after_parked", f"a {event_type} after "
                         "CASE_AWAITING_REVIEW in the same attempt")
        self.parked = self.parked or event_type == PARKING_EVENT_TYPE
        self.ended = self.ended or event_type in TERMINAL_EVENT_TYPES
        return event_type

    def _signed_type(self, event: TrailEvent) -> str | None:
        """Check the event's signature and chain (and the persons' actions it records);
        its type as signed, else as stored."""
        if event.integrity is None or event.body is None or event.schema_version < 2:
            self.problem(event.seq, "unsigned", "version-1 event: stored before signing, "
                         "it cannot be verified")
            self.prev_hash = GENESIS
            return event.columns.get("eventType")
        envelope = check_signed(event, self.prev_hash, self.keys, self.report.problems)
        event_type = (envelope or {}).get("eventType") or event.columns.get("eventType")
        if event_type == "CASE_REVIEWED" and envelope is not None:
            self.report.reviews.append(_review_of(self.attempt, event.seq, envelope))
        if envelope is not None and event_type in ("CASE_STARTED", "CASE_REVIEWED",
                                                   "REACT_CYCLE", "CASE_ERASED"):
            _check_actions(self.report, (self.attempt, event.seq), envelope,
                           self.action_keys)
        self.prev_hash = self.head = event.integrity.hash
        return event_type

    def summary(self, events: int) -> dict[str, Any]:
        return {"attempt": self.attempt, "events": events, "headHash": self.head,
                "ended": self.ended, **({"parked": True} if self.parked else {})}


def _gap(expected: int, seq: int) -> str:
    if seq < expected:
        return f"seq {seq} appears twice"
    return f"seq {expected} is missing" if seq == expected + 1 else \
        f"seq {expected}…{seq - 1} is missing"


def _check_ending(report: Report, terminals: list[tuple[int, int]],
                  last_attempt: int | None, case_ended: bool) -> None:
    """One terminal event, on the last attempt; none on a case recorded as ended is a
    problem; no terminal and a last attempt that parked is a case waiting."""
    for attempt, seq in terminals[1:]:
        report.problems.append(Problem(attempt, seq, "extra_terminal",
                                       "a second terminal event"))
    if terminals and terminals[0][0] != last_attempt:
        attempt, seq = terminals[0]
        report.problems.append(Problem(attempt, seq, "terminal_not_last",
                                       f"the terminal event is on attempt {attempt}, not on "
                                       f"the last attempt {last_attempt}"))
    report.complete = bool(terminals)
    report.parked = not terminals and bool(report.attempts) and \
        bool(report.attempts[-1].get("parked"))
    if not terminals and case_ended:
        report.problems.append(Problem(last_attempt, None, "missing_terminal",
                                       "the case is recorded as ended but its trail has no "
                                       "terminal event"))


def _check_actions(report: Report, at: tuple[int, int], envelope: Mapping[str, Any],
                   action_keys: Mapping[str, PublicKey] | None) -> None:
    """The persons' actions an event records (a review, or answers to the model's
    questions): each the one its signed action says, signed by an action key."""
    payload = envelope.get("payload") or {}
    if not isinstance(payload, Mapping):
        return
    found: list[tuple[Any, Any]] = []  # (signed action or None, how it is compared)
    if envelope.get("eventType") == "CASE_STARTED":
        found.append((payload.get("startAction"), lambda a: started_problem(
            report.case_id, envelope.get("tenantId"), payload, a)))
    if envelope.get("eventType") == "CASE_REVIEWED":
        found.append((payload.get("action"), lambda a: review_problem(
            report.case_id, envelope.get("tenantId"), at[0], payload, a)))
    # A person's erasure carries the API's signed action; a policy's is the worker's own.
    if envelope.get("eventType") == "CASE_ERASED" and not str(
            payload.get("erasedBy", "")).startswith("retention:"):
        found.append((payload.get("action"), lambda a: erased_problem(
            report.case_id, envelope.get("tenantId"), payload, a)))
    for call in payload.get("toolCalls") or ():
        result = call.get("toolResult") if isinstance(call, Mapping) else None
        if isinstance(result, Mapping) and "answeredBy" in result:
            found.append((result.get("action"), lambda a, c=call, r=result: answer_problem(
                report.case_id, envelope.get("tenantId"), at[0], c.get("toolCallId"), r, a)))
    for raw, compare in found:
        if raw is None:
            report.warnings.append(Problem(*at, "unsigned_action", "a person's action "
                                           "recorded before actions were signed"))
            continue
        try:
            action = SignedAction.from_json(raw)
        except IntegrityError as exc:
            report.problems.append(Problem(*at, "bad_action", str(exc)))
            continue
        mismatch = compare(action)
        if mismatch is not None:
            report.problems.append(Problem(*at, "bad_action", mismatch))
        if action_keys is None:
            report.warnings.append(Problem(*at, "action_unchecked", f"the signature of a "
                                           f"person's action (action key {action.key_id}) "
                                           "was not checked: no action keys given"))
            continue
        problem = signature_problem(action, action_keys)
        if problem is not None:
            report.problems.append(Problem(*at, "bad_action_signature", problem))


def _review_of(attempt: int, seq: int, envelope: Mapping[str, Any]) -> dict[str, Any]:
    payload = envelope.get("payload") or {}
    decision = payload.get("decision")
    return {"attempt": attempt, "seq": seq, "reviewer": payload.get("reviewer"),
            "verdict": payload.get("verdict"), "reviewedAt": payload.get("reviewedAt"),
            **({"decision": decision} if decision is not None else {})}


def checked_at() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
