#!/usr/bin/env python3
"""A standalone verifier of casetrail bundles (docs/bundle.md), independent of casetrail.

Needs only the standard library and ``cryptography`` (Ed25519). Usage:

    python verify_bundle.py BUNDLE.json --trust BASE64_PUBLIC_KEY[@NOT_VALID_AFTER] [...]

Trust comes from you only: what the bundle says of its keys (``notValidAfter``) is
ignored, and so is an event's ``occurredAt`` (the signer's own word). This verifier does
not check the transparency log, so it cannot tell when an event was signed: an event
under a key you trust only until a time (``@2026-12-01T00:00:00Z``) is refused here;
``casetrail verify-bundle --trust-log … --trust-witness …`` accepts it when a trusted
witness cosigned a checkpoint holding it before that time.

Exit 0 when the bundle verifies, 1 when it does not (each problem printed), 2 when
it cannot be read.
"""

import argparse
import base64
import hashlib
import json
import sys
from datetime import datetime

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

GENESIS = "0" * 64
TERMINAL = {"CASE_COMPLETED", "CASE_FAILED", "CASE_TIMED_OUT", "CASE_CANCELLED"}
ADMINISTRATIVE = {"CASE_ERASED"}  # may follow the terminal event
ENDED = {"completed", "failed", "timed_out", "cancelled"}


def stamp(text):
    return datetime.fromisoformat(text.replace("Z", "+00:00")) if text else None


def signature_problems(where, integrity, keys):
    """What is wrong with an event's signature under the keys you trust."""
    key = keys.get(integrity["keyId"])
    if key is None:
        return [f"{where}: unknown_key {integrity['keyId']}"]
    problems = []
    if key[1] is not None:
        problems.append(f"{where}: retired_key (you trust key {integrity['keyId']} only "
                        "until a time, and this verifier cannot show when it signed this)")
    text = integrity["sig"]
    sig = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    try:
        Ed25519PublicKey.from_public_bytes(key[0]).verify(sig, bytes.fromhex(integrity["hash"]))
    except InvalidSignature:
        problems.append(f"{where}: bad_signature")
    return problems


def check(bundle, trusted):
    """``trusted``: ``(public key bytes, not valid after or None)`` pairs, yours."""
    problems = []
    keys = {}
    for raw, not_valid_after in trusted:
        kid = hashlib.sha256(raw).hexdigest()[:16]
        keys[kid] = (raw, not_valid_after)
    attempts = {}
    for event in bundle["events"]:
        attempts.setdefault(event["attempt"], []).append(event)
    terminals = []
    for attempt in sorted(attempts):
        prev, expected = GENESIS, 0
        for event in sorted(attempts[attempt], key=lambda e: e["seq"]):
            where = f"attempt {attempt} seq {event['seq']}"
            if event["seq"] != expected:
                problems.append(f"{where}: seq_gap (expected seq {expected})")
            expected = event["seq"] + 1
            integrity, body = event.get("integrity"), (event.get("body") or "").encode()
            if not integrity:
                problems.append(f"{where}: unsigned")
                continue
            if integrity["prevHash"] != prev:
                problems.append(f"{where}: broken_link")
            digest = hashlib.sha256(integrity["prevHash"].encode() + b"\n" + body).hexdigest()
            if digest != integrity["hash"]:
                problems.append(f"{where}: hash_mismatch")
            prev = integrity["hash"]
            envelope = json.loads(body)
            if (envelope.get("attempt"), envelope.get("seq")) != (attempt, event["seq"]):
                problems.append(f"{where}: column_mismatch (the signed event is elsewhere)")
            problems += signature_problems(where, integrity, keys)
            if terminals and terminals[-1] == attempt \
                    and envelope.get("eventType") not in ADMINISTRATIVE:
                problems.append(f"{where}: after_terminal")
            if envelope.get("eventType") in TERMINAL:
                terminals.append(attempt)
    if len(terminals) > 1:
        problems.append("extra_terminal: more than one terminal event")
    if terminals and terminals[0] != max(attempts):
        problems.append("terminal_not_last: the terminal event is not on the last attempt")
    if not terminals and bundle.get("case", {}).get("status") in ENDED:
        problems.append("missing_terminal: the case ended but the trail has no terminal event")
    return problems, bool(terminals)


def _jcs_numbers(value):
    if isinstance(value, float) and value.is_integer() and abs(value) < 2 ** 53:
        return int(value)  # RFC 8785 prints 25000.0 as 25000
    if isinstance(value, dict):
        return {k: _jcs_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jcs_numbers(v) for v in value]
    return value


def canonical(value):
    """RFC 8785 for what a backtest's results hold (strings, integers, decimals between
    1e-6 and 1e21, booleans, null): keys sorted, no whitespace, numbers as ECMAScript
    prints them."""
    return json.dumps(_jcs_numbers(value), sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False, allow_nan=False).encode()


def check_backtest(bundle, trusted):
    """A backtest's bundle (casetrail-backtest/1): the record's hash and signature, and
    every result against the digest the record names for it."""
    keys = {hashlib.sha256(raw).hexdigest()[:16]: (raw, until) for raw, until in trusted}
    record, results = bundle["record"], bundle["results"]
    integrity, body = record["integrity"], record["body"].encode()
    problems = []
    digest = hashlib.sha256(integrity["prevHash"].encode() + b"\n" + body).hexdigest()
    if digest != integrity["hash"]:
        problems.append("record: hash_mismatch")
    problems += signature_problems("record", integrity, keys)
    named = json.loads(body).get("results", [])
    mine = [[r.get("caseId"), hashlib.sha256(canonical(r)).hexdigest()] for r in results]
    if named != mine:
        problems.append("results_mismatch: the results are not the ones the record names")
    return problems


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle")
    parser.add_argument("--trust", action="append", required=True,
                        help="a trusted Ed25519 public key, base64, optionally @ the time "
                             "after which you no longer trust it (repeatable)")
    args = parser.parse_args()
    try:
        with open(args.bundle, "rb") as handle:
            bundle = json.load(handle)
        if bundle.get("format") not in ("casetrail-bundle/1", "casetrail-backtest/1"):
            raise ValueError("not a casetrail-bundle/1 or casetrail-backtest/1 file")
        trusted = []
        for entry in args.trust:
            key, _, until = entry.partition("@")
            trusted.append((base64.b64decode(key, validate=True), stamp(until)))
    except (OSError, ValueError) as exc:
        print(f"could not check: {exc}", file=sys.stderr)
        return 2
    if bundle["format"] == "casetrail-backtest/1":
        problems = check_backtest(bundle, trusted)
        for problem in problems:
            print(problem)
        print("NOT verified" if problems else
              f"verified: a backtest's record and its {len(bundle['results'])} results")
        return 1 if problems else 0
    problems, complete = check(bundle, trusted)
    for problem in problems:
        print(problem)
    if problems or not bundle["events"]:
        print("NOT verified")
        return 1
    print(f"verified: {len(bundle['events'])} events{', complete' if complete else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
