"""A backtest as evidence (docs/backtests.md, "The record"): one signed record per
backtest, chained to the one before, a leaf of its own kind in the transparency log,
and an offline bundle ``verify-bundle`` checks with nothing but the file and trusted keys.

The record (canonical JSON, signed as an event is: ``hash = SHA-256(prevHash "\\n"
body)``, Ed25519 over the hash) names what was run and what came of it: the agent and
the digests of the champion's recorded versions, the challenger's ``agentDigest`` and
model, the selection, the tool-answer policy, the summary people read, and the SHA-256
of every per-case result in order. The results themselves are kept beside it and travel
in the bundle; one changed byte in either fails the check.

The bundle (``"format": "casetrail-backtest/1"``):

    {"format": "casetrail-backtest/1", "backtestId": ..., "exportedAt": ...,
     "record": {"body": "<the signed bytes as UTF-8>", "integrity": {...},
                "logProof": "<C2SP tlog-proof>"},
     "results": [{...}, ...], "keys": [...], "log": {"checkpoint": ..., "verifierKeys": [...]}}
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Sequence
from typing import Any

import orjson

from casetrail.audit.evidence import BundleError, TrustedKey, signed_while_valid
from casetrail.contract.integrity import (
    Integrity,
    IntegrityError,
    canonical,
    chain_hash,
    key_id,
    signature_valid,
)
from casetrail.ledger.note import Verifier
from casetrail.ledger.proofs import LoggedEvent, check_log
from casetrail.trail.verification import Problem, Report, TrailEvent

BACKTEST_FORMAT = "casetrail-backtest/1"
RECORD_FORMAT = "casetrail-backtest-record/1"


def result_digest(result: dict[str, Any]) -> str:
    """The SHA-256 of one per-case result's canonical JSON, as the record names it."""
    return hashlib.sha256(canonical(result)).hexdigest()


def record_body(backtest: dict[str, Any], summary: dict[str, Any],
                results: Sequence[dict[str, Any]]) -> bytes:
    """The bytes a backtest's record signs: ``backtest`` (what was asked and run: ids,
    agent, digests, model, selection, policy, who, when), the summary without the
    per-case results, and each result's digest."""
    return canonical({
        "format": RECORD_FORMAT, **backtest,
        "summary": {k: v for k, v in summary.items() if k != "results"},
        "results": [[r["caseId"], result_digest(r)] for r in results]})


def bundle(record: dict[str, Any], results: Sequence[dict[str, Any]],
           keys: list[dict[str, Any]], proof: str | None, log: dict[str, Any] | None,
           exported_at: str) -> dict[str, Any]:
    """A backtest's bundle from its stored record (``body``, ``prev_hash``, ``hash``,
    ``key_id``, ``sig``), its results, the signing keys and its log proof."""
    integrity = Integrity(record["prev_hash"], record["hash"], record["key_id"], record["sig"])
    return {"format": BACKTEST_FORMAT, "backtestId": str(record["backtest_id"]),
            "exportedAt": exported_at,
            "record": {"body": bytes(record["body"]).decode(),
                       "integrity": integrity.as_json(),
                       **({"logProof": proof} if proof else {})},
            "results": list(results), "keys": keys, **({"log": log} if log else {})}


def record_problems(record: dict[str, Any], prev_hash: str, keys: dict[str, bytes],
                    results: Sequence[dict[str, Any]]) -> list[str]:
    """What is wrong with a stored record (as ``casetrail audit`` reads it): its place in
    the chain after ``prev_hash``, its hash, its signature under the registered ``keys``
    (key id → public key), and its ``results`` against the digests it names."""
    body, problems = bytes(record["body"]), []
    if record["prev_hash"] != prev_hash:
        problems.append("chain_broken")
    problems += seal_problems(record, keys)
    try:
        named = orjson.loads(body)["results"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        named = None
    if named != [[r.get("caseId"), result_digest(r)] for r in results]:
        problems.append("results_mismatch")
    return problems


def seal_problems(record: dict[str, Any], keys: dict[str, bytes]) -> list[str]:
    """Whether a stored record's bytes are the ones its hash names (``hash_mismatch``)
    and its signature verifies under one of ``keys`` (``unknown_key``,
    ``bad_signature``): what anyone who reads a record as signed must check first."""
    problems = []
    if chain_hash(record["prev_hash"], bytes(record["body"])) != record["hash"]:
        problems.append("hash_mismatch")
    key = keys.get(record["key_id"])
    if key is None or not signature_valid(key, record["hash"], record["sig"]):
        problems.append("bad_signature" if key is not None else "unknown_key")
    return problems


def _read(found: Any) -> tuple[str, bytes, Integrity, list[Any]]:
    if not isinstance(found, dict) or found.get("format") != BACKTEST_FORMAT:
        raise BundleError(f"not a {BACKTEST_FORMAT} file")
    record, results = found.get("record"), found.get("results")
    if not isinstance(record, dict) or not isinstance(record.get("body"), str) \
            or not isinstance(results, list):
        raise BundleError("a backtest bundle needs a record with its body, and results")
    try:
        integrity = Integrity.from_json(record.get("integrity"))
    except IntegrityError as exc:
        raise BundleError(f"record: {exc}") from None
    return str(found.get("backtestId")), record["body"].encode(), integrity, results


def verify_backtest_bundle(found: Any, trusted: Sequence[bytes | TrustedKey],
                           log_keys: Sequence[Verifier] = (),
                           witnesses: Sequence[Verifier] = ()) -> Report:
    """Check a backtest bundle against ``trusted`` keys alone: the record's hash and
    signature, each result against the digest the record names for it (same cases, same
    order, nothing added), and the log proof against its checkpoint (with ``log_keys``:
    signed by one, the record logged; with ``witnesses``: cosigned by each)."""
    backtest_id, body, integrity, results = _read(found)
    report = Report(backtest_id, events=1, complete=True)

    def problem(code: str, message: str) -> None:
        report.problems.append(Problem(None, None, code, message))

    if chain_hash(integrity.prev_hash, body) != integrity.hash:
        problem("hash_mismatch", "the record's bytes do not hash to the hash it names")
    trust = [t if isinstance(t, TrustedKey) else TrustedKey(t) for t in trusted]
    keys = {key_id(t.public_key): t for t in trust}
    key = keys.get(integrity.key_id)
    if key is None:
        problem("unknown_key", f"the record is signed by key {integrity.key_id}, which you "
                "do not trust")
    elif not signature_valid(key.public_key, integrity.hash, integrity.sig):
        problem("bad_signature", "the record's signature does not verify")
    try:
        named = orjson.loads(body)
        digests = named["results"]
        if str(uuid.UUID(named["backtestId"])) != backtest_id:
            problem("column_mismatch", "the signed record is of another backtest")
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        problem("malformed", "the record's body is not a backtest record")
        digests = []
    if len(digests) != len(results):
        problem("results_mismatch", f"the record names {len(digests)} results and the "
                f"bundle holds {len(results)}")
    for index, (pair, result) in enumerate(zip(digests, results, strict=False)):
        if not isinstance(result, dict) or [result.get("caseId"), result_digest(result)] \
                != pair:
            problem("results_mismatch", f"results[{index}] is not the result the record "
                    "names")
    proof = found["record"].get("logProof")
    log = found.get("log")
    checkpoint = log.get("checkpoint") if isinstance(log, dict) else None
    check = check_log(checkpoint if isinstance(checkpoint, str) else None,
                      [LoggedEvent(0, 0, integrity.hash,
                                   proof if isinstance(proof, str) else None)],
                      log_keys, witnesses)
    report.problems.extend(check.problems)
    report.problems.extend(signed_while_valid(
        [TrailEvent(0, 0, 2, body, integrity)],
        {kid: t.not_valid_after for kid, t in keys.items() if t.not_valid_after is not None},
        check.included, check.cosigned_at))
    report.log = check.as_json()
    return report
