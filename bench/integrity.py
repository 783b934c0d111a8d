"""What the integrity costs per event, on one core: canonicalising the envelope
(RFC 8785), chaining and signing it (the worker), checking it (the consumer), and
keeping a case's sensitive values out of it (the worker).
``python -m bench.integrity [EVENTS]``."""

from __future__ import annotations

import sys
import time
from typing import Any

import orjson

from bench.raw import sample_cycles
from casetrail.consumers.admission import Admission, KeyRing, Refused
from casetrail.contract.integrity import GENESIS, HEADER, Signer, chain_hash, signature_valid
from casetrail.privacy.sensitive import Redaction
from casetrail.trail.verification import PublicKey


def _per_event(seconds: float, count: int) -> float:
    return round(seconds / count * 1e6, 1)


def integrity_costs(count: int = 5000) -> dict[str, Any]:
    events = sample_cycles(count)
    signer = Signer.generate()
    started = time.process_time()
    bodies = [e.to_json() for e in events]
    canonical = time.process_time() - started
    started = time.process_time()
    seals, prev = [], GENESIS
    for body in bodies:
        seal = signer.seal(prev, body)
        seals.append(seal)
        prev = seal.hash
    sealing = time.process_time() - started
    started = time.process_time()
    assert all(chain_hash(s.prev_hash, b) == s.hash and
               signature_valid(signer.public_key, s.hash, s.sig)
               for s, b in zip(seals, bodies, strict=True))
    verifying = time.process_time() - started
    ring = KeyRing(registry=None, keys={signer.key_id: PublicKey(signer.key_id,
                                                                   signer.public_key)})
    admission = Admission("worker", ring)
    started = time.process_time()
    for seal, body in zip(seals, bodies, strict=True):
        try:
            admission.admit(body, {HEADER: seal.as_json()}, "worker")
        except Refused as exc:  # pragma: no cover - a benchmark of genuine events
            raise AssertionError(exc.reason) from exc
    admitting = time.process_time() - started
    # Sensitive values, replaced in the event's JSON values before it is made canonical
    # (once, as every event is): one that holds none costs a serialization and a scan
    # for each value; one that holds one is rewritten in its strings.
    values = [e.wire_values() for e in events]
    absent = Redaction.of({"[pii:applicantName]": "Maria Okafor",
                           "[pii:customerId]": "C-4711"})
    started = time.process_time()
    for data in values:
        absent.replace_in(data)
    scanning = time.process_time() - started
    word = orjson.loads(bodies[0])["payload"]["reasoningText"].split()[0]
    present = Redaction.of({"[pii:applicantName]": word})
    started = time.process_time()
    for data in values:
        present.replace_in(data)
    rewriting = time.process_time() - started
    return {
        "events": count, "bodyBytes": len(bodies[0]),
        "canonicalMicroseconds": _per_event(canonical, count),
        "chainAndSignMicroseconds": _per_event(sealing, count),
        "hashAndVerifyMicroseconds": _per_event(verifying, count),
        "consumerAdmitMicroseconds": _per_event(admitting, count),
        "redactionScanMicroseconds": _per_event(scanning, count),
        "redactionRewriteMicroseconds": _per_event(rewriting, count),
    }


if __name__ == "__main__":
    print(integrity_costs(int(sys.argv[1]) if len(sys.argv) > 1 else 5000))
