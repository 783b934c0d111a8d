"""A person's action as the API signs it and the worker checks it (no services): the
signed bytes and signatures of docs/bundle.md's test vectors, checked with OpenSSL
(``cryptography``) as well as libsodium, and each refusal the worker makes."""

from __future__ import annotations

import base64
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from casetrail.contract.integrity import Signer, public_key_text
from casetrail.trail.person_actions import (
    PersonAction,
    SignedAction,
    action_bytes,
    review_problem,
    sign_action,
    sign_object,
    signature_problem,
    start_object,
    start_refusal,
    started_problem,
    vet_action,
)
from casetrail.trail.verification import PublicKey

VECTOR_KEY = Signer(Ed25519PrivateKey.from_private_bytes(bytes(range(32))))
CASE = uuid.UUID("0b6f1d7e-1c2a-4d5e-9f00-123456789abc")
OVERRIDE = PersonAction(
    CASE, "acme", 1, "review", "review", datetime(2026, 12, 3, 12, 0, 0, 250000, tzinfo=UTC),
    person={"subject": "rita", "via": "key", "keyId": "k-rita"}, verdict="override",
    reason="Debts verified by phone.",
    decision={"decision": "decline", "applicantId": "A-1002"})
ANSWER = PersonAction(
    CASE, "acme", 2, "question", "answer", datetime(2026, 12, 3, 12, 5, tzinfo=UTC),
    person={"subject": "rita", "via": "oidc"}, call_id="ask-1", answer="Yes, twice a year.")
KEYS = {VECTOR_KEY.key_id: PublicKey(VECTOR_KEY.key_id, VECTOR_KEY.public_key)}


@pytest.mark.parametrize(("action", "text", "sig"), [
    (OVERRIDE,
     'casetrail/person-action/v1\n{"actedAt":"2026-12-03T12:00:00.250000Z","caseId":'
     '"0b6f1d7e-1c2a-4d5e-9f00-123456789abc","decisionSha256":"0a7eaf6ba07055781cd303c1a767'
     '35eb54e1f2678ebbf9125c8b25a51c887804","kind":"review","person":{"keyId":"k-rita",'
     '"subject":"rita","via":"key"},"reasonSha256":"4fdd4707b4379c0cd1fa55aaa5704055959f2'
     '1ad9f34f6a4fcd7d73acb6229d1","tenantId":"acme","verdict":"override","wait":1,'
     '"waitKind":"review"}',
     "5zlcGV8XGTRYU4mZHOF8JcmEwT6lVesVeo3TkWL8gkipz2eeaAWq7nli27ZOxbQob8qzbKrM6-L92uHsYjrFDg"),
    (ANSWER,
     'casetrail/person-action/v1\n{"actedAt":"2026-12-03T12:05:00.000000Z","answerSha256":'
     '"a4d2a6d7cd203582289667c1416f1b37286acc4b5cd91d786e5caab5b4a5acfc","callId":"ask-1",'
     '"caseId":"0b6f1d7e-1c2a-4d5e-9f00-123456789abc","kind":"answer","person":{"subject":'
     '"rita","via":"oidc"},"tenantId":"acme","wait":2,"waitKind":"question"}',
     "jOMJi4rSqhReNHNeVyFYtCDyXh4xod5tsxC0oVYCXxeCcTlH8VUhDeoH1XcH38bV_EUICNKGbvbLzfnlUYazBw"),
])
def test_the_signed_bytes_and_signatures_are_docs_bundle_md_vectors(
    action: PersonAction, text: str, sig: str,
) -> None:
    signed = sign_action(VECTOR_KEY, action)
    assert public_key_text(VECTOR_KEY.public_key) == \
        "A6EHv/POEL4dcN0Y50vAmWfk1jCbpQ1fHdyGZBJVMbg="
    assert action_bytes(signed.signed).decode() == text
    assert signed.sig == sig and signed.key_id == "56475aa75463474c"
    # OpenSSL agrees with libsodium on the same bytes
    raw = base64.urlsafe_b64decode(sig + "==")
    Ed25519PrivateKey.from_private_bytes(bytes(range(32))).public_key().verify(
        raw, text.encode())
    assert signature_problem(signed, KEYS) is None


def test_a_signature_over_other_bytes_or_by_an_unknown_or_retired_key_is_refused() -> None:
    signed = sign_action(VECTOR_KEY, OVERRIDE)
    changed = SignedAction({**signed.signed, "verdict": "confirm"}, signed.key_id, signed.sig)
    assert "does not verify" in (signature_problem(changed, KEYS) or "")
    assert "not registered" in (signature_problem(signed, {}) or "")
    retired = {VECTOR_KEY.key_id: PublicKey(VECTOR_KEY.key_id, VECTOR_KEY.public_key,
                                            OVERRIDE.acted_at - timedelta(seconds=1))}
    assert "not-valid-after" in (signature_problem(signed, retired) or "")


def vet(expected: PersonAction, signed: SignedAction | None, **rules: object) -> str | None:
    found = vet_action(expected, signed, KEYS, asked=rules.get("asked"),  # type: ignore[arg-type]
                       starter=rules.get("starter"),  # type: ignore[arg-type]
                       reviewers=rules.get("reviewers", ()),  # type: ignore[arg-type]
                       decision_errors=rules.get("errors", ()))  # type: ignore[arg-type]
    return None if found is None else found.code


def test_the_worker_refuses_each_action_it_cannot_check() -> None:
    signed = sign_action(VECTOR_KEY, OVERRIDE)
    assert vet(OVERRIDE, signed, starter="sam") is None
    assert vet(OVERRIDE, None) == "unsigned"
    # the row says another decision than the one signed
    assert vet(replace(OVERRIDE, decision={"decision": "approve"}), signed) == "mismatch"
    # signed for wait 1, kept (or replayed) for wait 3
    assert vet(replace(OVERRIDE, wait=3), signed) == "mismatch"
    attacker = Signer.generate()
    assert vet(OVERRIDE, sign_action(attacker, OVERRIDE)) == "bad_signature"
    assert vet(OVERRIDE, signed, starter="rita") == "four_eyes"
    second = replace(OVERRIDE, wait_kind="second_review", verdict="confirm", decision=None)
    assert vet(second, sign_action(VECTOR_KEY, second), reviewers=("rita",)) == "four_eyes"
    assert vet(second, sign_action(VECTOR_KEY, second), reviewers=("ravi",)) is None
    assert vet(OVERRIDE, signed, errors=("decision: not one of approve, refer",)) == \
        "invalid_decision"
    review_on_question = replace(OVERRIDE, wait_kind="question")
    assert vet(review_on_question, sign_action(VECTOR_KEY, review_on_question)) == "wrong_wait"
    answer = sign_action(VECTOR_KEY, ANSWER)
    assert vet(ANSWER, answer, asked="ask-1") is None
    assert vet(ANSWER, answer, asked="ask-2") == "wrong_wait"


def test_a_recorded_review_is_compared_with_what_was_signed() -> None:
    signed = sign_action(VECTOR_KEY, OVERRIDE)
    recorded = {"reviewer": dict(OVERRIDE.person or {}), "verdict": "override",
                "decision": dict(OVERRIDE.decision or {}), "reason": OVERRIDE.reason,
                "reviewedAt": "2026-12-03T12:00:00.25Z"}
    assert review_problem(str(CASE), "acme", 2, recorded, signed) is None
    assert review_problem(str(CASE), "acme", 1, recorded, signed) is not None  # own wait
    assert review_problem(str(uuid.uuid4()), "acme", 2, recorded, signed) is not None
    for change in ({"verdict": "confirm"}, {"reason": "Another reason."},
                   {"reviewer": {"subject": "ceo", "via": "oidc"}},
                   {"decision": {"decision": "approve"}},
                   {"reviewedAt": "2026-12-03T12:00:01Z"}):
        assert review_problem(str(CASE), "acme", 2, recorded | change, signed) is not None
    # a reason whose sensitive values the trail holds as placeholders cannot be compared
    redacted = recorded | {"reason": "Spoke with [pii:applicant.name] by phone."}
    assert review_problem(str(CASE), "acme", 2, redacted, signed) is None


def test_a_case_runs_only_from_the_start_the_api_signed() -> None:
    """The worker's check of a case row, and the verifier's of CASE_STARTED."""
    started = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
    given = {"applicantId": "A-1", "name": "[pii:name]"}
    row: dict[str, Any] = {"case_id": CASE, "tenant_id": "acme", "agent": "loan-officer",
                           "started_by": "key:k1", "case_input": given}
    signed = sign_object(VECTOR_KEY, start_object(CASE, "acme", "loan-officer", "key:k1",
                                                  given, started))
    assert start_refusal(signed, KEYS, **row) is None
    assert start_refusal(None, KEYS, **row).code == "unsigned"  # type: ignore[union-attr]
    for change in ({"agent": "aml-screening"}, {"started_by": "oidc:ceo"},
                   {"case_input": {"applicantId": "A-2"}}, {"case_id": uuid.uuid4()},
                   {"tenant_id": "other"}):
        found = start_refusal(signed, KEYS, **(row | change))
        assert found is not None and found.code == "mismatch", change
    theirs = sign_object(Signer.generate(), signed.signed)
    assert start_refusal(theirs, KEYS, **row).code == "bad_signature"  # type: ignore[union-attr]
    recorded = {"agent": "loan-officer", "startedBy": "key:k1", "input": given}
    assert started_problem(str(CASE), "acme", recorded, signed) is None
    assert started_problem(str(CASE), "acme", recorded | {"startedBy": "oidc:ceo"},
                           signed) is not None
    assert started_problem(str(CASE), "acme", recorded | {"input": {"applicantId": "A-9"}},
                           signed) is not None
