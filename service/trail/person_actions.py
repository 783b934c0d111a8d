"""A person's action, signed by the API with its action key (docs/design.md, "A person's
action is signed"; the signed bytes and their test vectors: docs/bundle.md).

A review, an answer to the model's question or a cancel of a waiting case is kept in
``case_actions`` with the object the API signed. The worker rebuilds that object from
the row and from the wait its own trail records, and acts only when the two agree and
the signature verifies under a key an operator registered (``action_keys``): a row
written with a component's database password alone is refused. The events that record
the action carry the signed object, so ``verify`` and ``verify-bundle`` check it
offline against the action keys the auditor trusts.

The signed object holds digests of the free text (reason, decision, answer), never the
text: the event carries the text, which may have a case's sensitive values replaced by
placeholders, and the object stays checkable either way.

No I/O.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from casetrail.contract.integrity import IntegrityError, Signer, canonical, message_signature_valid
from casetrail.privacy.sensitive import PLACEHOLDER

ACTION_CONTEXT = b"casetrail/person-action/v1\n"
"""Prefixed to the canonical JSON of the signed object: an action key's signature can
never be taken for a signature over anything else."""

WaitKind = Literal["review", "second_review", "question"]
ActionKind = Literal["review", "answer", "cancel"]


def wait_kind(question: str | None, reasons: Sequence[str]) -> WaitKind:
    """What a parked attempt waits for: the answer to the question ``question`` (its call
    id), a second person's review of an override, or a review."""
    if question is not None:
        return "question"
    return "second_review" if "second_review" in reasons else "review"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def text_digest(text: str) -> str:
    """SHA-256 of the text's UTF-8 bytes, hex."""
    return _sha256(text.encode("utf-8"))


def json_digest(value: Any) -> str:
    """SHA-256 of the value's RFC 8785 canonical JSON, hex."""
    return _sha256(canonical(value))


def acted_at_text(when: datetime) -> str:
    """A time as the signed object writes it: UTC, microseconds, ``Z``."""
    return when.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class PersonAction:
    """What a person did about one wait of a case, as the API keeps it."""

    case_id: uuid.UUID
    tenant_id: str
    wait: int
    """The parked attempt the action answers."""
    wait_kind: WaitKind
    kind: ActionKind
    acted_at: datetime
    person: Mapping[str, Any] | None = None
    """The person (``reviewer``'s shape); a cancel names ``by`` instead."""
    by: str | None = None
    """Who cancelled (a key or a subject), for a cancel."""
    verdict: str | None = None
    reason: str | None = None
    decision: Mapping[str, Any] | None = None
    call_id: str | None = None
    answer: str | None = None

    def signed_object(self) -> dict[str, Any]:
        """The object the API signs (and the events carry)."""
        signed: dict[str, Any] = {
            "caseId": str(self.case_id), "tenantId": self.tenant_id, "wait": self.wait,
            "waitKind": self.wait_kind, "kind": self.kind,
            "actedAt": acted_at_text(self.acted_at)}
        optional: dict[str, Any] = {
            "person": None if self.person is None else dict(self.person),
            "by": self.by, "verdict": self.verdict,
            "reasonSha256": None if self.reason is None else text_digest(self.reason),
            "decisionSha256": None if self.decision is None else json_digest(
                dict(self.decision)),
            "callId": self.call_id,
            "answerSha256": None if self.answer is None else text_digest(self.answer)}
        signed.update({k: v for k, v in optional.items() if v is not None})
        return signed


def action_bytes(signed: Mapping[str, Any]) -> bytes:
    """The bytes an action key signs: the context string, then the object's RFC 8785
    canonical JSON."""
    return ACTION_CONTEXT + canonical(dict(signed))


@dataclass(frozen=True)
class SignedAction:
    """The signed object, the action key's id and the Ed25519 signature (base64url)."""

    signed: dict[str, Any]
    key_id: str
    sig: str

    def as_json(self) -> dict[str, Any]:
        return {"signed": self.signed, "keyId": self.key_id, "sig": self.sig}

    @classmethod
    def from_json(cls, value: Any) -> SignedAction:
        """``IntegrityError`` naming what is malformed."""
        if not isinstance(value, Mapping):
            raise IntegrityError("the signed action must be an object")
        signed, key, sig = value.get("signed"), value.get("keyId"), value.get("sig")
        if not isinstance(signed, Mapping) or not isinstance(key, str) \
                or not isinstance(sig, str):
            raise IntegrityError("the signed action needs signed, keyId and sig")
        return cls(dict(signed), key, sig)


def sign_action(signer: Signer, action: PersonAction) -> SignedAction:
    return sign_object(signer, action.signed_object())


def signature_problem(action: SignedAction, keys: Mapping[str, Any]) -> str | None:
    """Why ``action``'s signature does not hold under ``keys`` (key id → an object with
    ``public_key`` and ``not_valid_after``), or ``None`` when it does."""
    key = keys.get(action.key_id)
    if key is None:
        return f"action key {action.key_id} is not registered or not trusted"
    if key.not_valid_after is not None:
        acted = _time(action.signed.get("actedAt"))
        if acted is None or acted > key.not_valid_after:
            return f"signed under action key {action.key_id} after its not-valid-after time"
    try:
        message = action_bytes(action.signed)
    except (IntegrityError, TypeError, ValueError):
        return "the signed action is not JSON"
    if not message_signature_valid(key.public_key, message, action.sig):
        return f"the action's signature does not verify under action key {action.key_id}"
    return None


def _time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def _digest_agrees(text: Any, digest: Any, of: str) -> str | None:
    """A mismatch between recorded text and its signed digest; a text with a case's
    sensitive values replaced by placeholders cannot be compared and is not one."""
    if text is None and digest is None:
        return None
    if text is None or digest is None:
        return f"the {of} is {'not ' if text is None else ''}recorded but " \
               f"{'' if digest is None else 'not '}signed"
    written = canonical(text) if not isinstance(text, str) else text.encode("utf-8")
    if _sha256(written) == digest:
        return None
    if PLACEHOLDER.search(written.decode("utf-8")):
        return None
    return f"the recorded {of} is not the one signed"


def _same_case(signed: Mapping[str, Any], case_id: str, tenant_id: str | None,
               kind: str, also: Sequence[tuple[bool, str]]) -> str | None:
    """The first way ``signed`` is not this case's ``kind`` (case, tenant, kind, then
    ``also``: each ``(holds, what it is for otherwise)``), or ``None``."""
    checks = [(signed.get("caseId") == case_id, "another case"),
              (tenant_id is None or signed.get("tenantId") == tenant_id, "another tenant"),
              (signed.get("kind") == kind, f"a {signed.get('kind')!r} action"), *also]
    return next((f"the signed {kind} is for {what}" for ok, what in checks if not ok), None)


def _before(signed: Mapping[str, Any], attempt: int) -> tuple[bool, str]:
    wait = signed.get("wait")
    return (isinstance(wait, int) and 1 <= wait < attempt,
            "a wait that is not before this attempt")


def review_problem(case_id: str, tenant_id: str | None, attempt: int,
                   payload: Mapping[str, Any], action: SignedAction) -> str | None:
    """Whether a recorded ``CASE_REVIEWED`` (``payload``, in ``attempt`` of ``case_id``)
    is the review its signed action says: the same case, tenant, person, verdict,
    reason, decision and time, on a wait before this attempt. Signature not checked."""
    signed = action.signed
    return _same_case(signed, case_id, tenant_id, "review", [
        (signed.get("waitKind") in ("review", "second_review"), "not a review's wait"),
        _before(signed, attempt),
        (signed.get("verdict") == payload.get("verdict"), "another verdict"),
        (signed.get("person") == payload.get("reviewer"), "another person"),
        (_time(signed.get("actedAt")) == _time(payload.get("reviewedAt")), "another time"),
    ]) or _digest_agrees(payload.get("reason"), signed.get("reasonSha256"), "reason") or \
        _digest_agrees(payload.get("decision"), signed.get("decisionSha256"), "decision")


def answer_problem(case_id: str, tenant_id: str | None, attempt: int, call_id: Any,
                   result: Mapping[str, Any], action: SignedAction) -> str | None:
    """Whether a recorded answer to the model's question (the question's ``result``,
    its call ``call_id``, in ``attempt`` of ``case_id``) is the answer its signed action
    says. Signature not checked."""
    signed = action.signed
    return _same_case(signed, case_id, tenant_id, "answer", [
        (signed.get("waitKind") == "question", "not an answer to a question"),
        _before(signed, attempt),
        (signed.get("callId") == call_id, "another question"),
        (signed.get("person") == result.get("answeredBy"), "another person"),
    ]) or _digest_agrees(result.get("answer"), signed.get("answerSha256"), "answer")


@dataclass(frozen=True)
class Refusal:
    """Why the worker will not act on a kept action: ``code`` is the metric's reason."""

    code: Literal["unsigned", "bad_signature", "mismatch", "wrong_wait", "four_eyes",
                  "invalid_decision"]
    message: str


def vet_action(expected: PersonAction, signed: SignedAction | None, keys: Mapping[str, Any],
               *, asked: str | None, starter: str | None, reviewers: tuple[str, ...],
               person: str | None = None, decision_errors: tuple[str, ...] = ()
               ) -> Refusal | None:
    """The worker's checks before it records an action: ``expected`` is the action as
    the kept row and the worker's own trail describe it (the wait its trail records,
    ``asked``: the question's call id when it waits for an answer). It must be what a
    registered action key signed, fit the wait, keep four eyes (not the ``starter``; on a
    second review, none of the ``reviewers`` so far; ``person``: who acts, as four eyes
    compares persons, default the action's subject) and, for an override, hold to the
    answer schema (``decision_errors`` empty)."""
    if signed is None:
        return Refusal("unsigned", "no action key signed it (written to the database "
                                   "directly, not through the API)")
    if signed.signed != expected.signed_object():
        return Refusal("mismatch", "what was signed is not what was kept for this wait")
    problem = signature_problem(signed, keys)
    if problem is not None:
        return Refusal("bad_signature", problem)
    if expected.kind == "cancel":
        return None
    fits = expected.kind == ("answer" if expected.wait_kind == "question" else "review")
    if not fits or (expected.kind == "answer" and expected.call_id != asked):
        return Refusal("wrong_wait", f"a {expected.kind} does not answer a "
                                     f"{expected.wait_kind} wait")
    subject = person or (expected.person or {}).get("subject")
    if subject is None:
        return Refusal("wrong_wait", f"a {expected.kind} names no person")
    if starter is not None and subject == starter:
        return Refusal("four_eyes", f"{subject} started the case")
    if expected.wait_kind == "second_review" and subject in reviewers:
        return Refusal("four_eyes", f"{subject} reviewed the case before")
    if decision_errors:
        return Refusal("invalid_decision", "; ".join(decision_errors))
    return None


def start_object(case_id: uuid.UUID, tenant_id: str, agent: str, started_by: str | None,
                 case_input: Mapping[str, Any], acted_at: datetime,
                 via: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What the API signs when it accepts a case: the case, its tenant and agent, who
    started it and the digest of its input as recorded (sensitive values as their
    placeholders); for a case another agent started over A2A, ``via``: ``{"protocol":
    "a2a", "messageId"}`` (absent for REST, so that older starts still check)."""
    signed: dict[str, Any] = {"caseId": str(case_id), "tenantId": tenant_id, "kind": "start",
                              "agent": agent, "inputSha256": json_digest(dict(case_input)),
                              "actedAt": acted_at_text(acted_at)}
    if started_by is not None:
        signed["by"] = started_by
    if via:
        signed["via"] = dict(via)
    return signed


def sign_object(signer: Signer, signed: dict[str, Any]) -> SignedAction:
    return SignedAction(signed, signer.key_id, signer.sign_message(action_bytes(signed)))


def start_refusal(action: SignedAction | None, keys: Mapping[str, Any], *,
                  case_id: uuid.UUID, tenant_id: str, agent: str, started_by: str | None,
                  case_input: Mapping[str, Any]) -> Refusal | None:
    """The worker's check of a case row before it runs it: the start an action key
    signed is this case's, as its row has it (a row written with a component's
    database password alone, or changed since, is refused)."""
    if action is None:
        return Refusal("unsigned", "no action key signed the case's start")
    signed = action.signed
    via = signed.get("via")  # how it came is the signer's word; the row does not hold it
    expected = start_object(case_id, tenant_id, agent, started_by, case_input,
                            _time(signed.get("actedAt")) or datetime.min.replace(tzinfo=UTC),
                            via if isinstance(via, dict) else None)
    if signed != expected:
        return Refusal("mismatch", "the signed start is not this case's row (another "
                                   "agent, starter or input)")
    problem = signature_problem(action, keys)
    return None if problem is None else Refusal("bad_signature", problem)


def started_problem(case_id: str, tenant_id: str | None, payload: Mapping[str, Any],
                    action: SignedAction) -> str | None:
    """Whether a recorded ``CASE_STARTED`` is the start its signed action says (the
    input compared unless it holds placeholders). Signature not checked."""
    signed = action.signed
    return _same_case(signed, case_id, tenant_id, "start", [
        (signed.get("agent") == payload.get("agent"), "another agent"),
        (signed.get("by") == payload.get("startedBy"), "another starter"),
    ]) or _digest_agrees(payload.get("input"), signed.get("inputSha256"), "input")


def erase_object(case_id: uuid.UUID, tenant_id: str, by: str, acted_at: datetime
                 ) -> dict[str, Any]:
    """What the API signs when a person asks for a case's sensitive values to be erased:
    the case, its tenant, who asked and when. The worker records the erasure only on
    such an object; the database shreds the values only when its ``CASE_ERASED`` is
    stored (docs/design.md, "Served values")."""
    return {"caseId": str(case_id), "tenantId": tenant_id, "kind": "erase", "by": by,
            "actedAt": acted_at_text(acted_at)}


def erase_refusal(action: SignedAction | None, keys: Mapping[str, Any], *,
                  case_id: uuid.UUID, tenant_id: str) -> Refusal | None:
    """The worker's check of an erase command: an erasure of this case, in its trail's
    tenant, signed by a registered action key."""
    if action is None:
        return Refusal("unsigned", "no action key signed the erasure")
    mismatch = _same_case(action.signed, str(case_id), tenant_id, "erase", [
        (isinstance(action.signed.get("by"), str) and bool(action.signed["by"]),
         "nobody"),
        (_time(action.signed.get("actedAt")) is not None, "no time")])
    if mismatch is not None:
        return Refusal("mismatch", mismatch)
    problem = signature_problem(action, keys)
    return None if problem is None else Refusal("bad_signature", problem)


def erased_problem(case_id: str, tenant_id: str | None, payload: Mapping[str, Any],
                   action: SignedAction) -> str | None:
    """Whether a recorded ``CASE_ERASED`` is the erasure its signed action asked for:
    the same case, tenant, person and time. Signature not checked."""
    signed = action.signed
    return _same_case(signed, case_id, tenant_id, "erase", [
        (signed.get("by") == payload.get("erasedBy"), "another person"),
        (_time(signed.get("actedAt")) == _time(payload.get("erasedAt")), "another time"),
    ])
