"""The trail emitter: chains, signs and redacts each event before any transport sees it,
and holds an attempt's chain only while the attempt emits."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import pytest

from casetrail.contract.events import CaseErasedPayload, Event, make_event
from casetrail.contract.integrity import (
    GENESIS,
    Integrity,
    Signer,
    chain_hash,
    signature_valid,
)
from casetrail.errors import CasetrailError, PublishRejected
from casetrail.privacy.sensitive import Redaction
from casetrail.trail.emitter import TrailEmitter
from tests.support.events import completed, cycle, started

SIGNER = Signer.generate()


@dataclass
class Kept:
    """A sink that keeps what it is handed (the emitter's output, before any transport)."""

    sent: list[tuple[Event, bytes, Integrity]] = field(default_factory=list)

    async def publish_sealed(self, event: Event, body: bytes, integrity: Integrity) -> None:
        self.sent.append((event, body, integrity))


def emitter(max_event_bytes: int = 1 << 20) -> tuple[TrailEmitter, Kept]:
    kept = Kept()
    return TrailEmitter(kept, SIGNER, max_event_bytes), kept


async def test_an_attempts_events_are_chained_and_signed_in_order() -> None:
    case_id = uuid.uuid4()
    trail, kept = emitter()
    with trail.attempt(case_id, 1):
        for event in (started(case_id), cycle(case_id, 1, 0), completed(case_id, 2)):
            await trail.emit(event)
    prev = GENESIS
    for _, body, integrity in kept.sent:
        assert integrity.prev_hash == prev
        assert integrity.hash == chain_hash(prev, body)
        assert integrity.key_id == SIGNER.key_id
        assert signature_valid(SIGNER.public_key, integrity.hash, integrity.sig)
        prev = integrity.hash


async def test_an_event_that_does_not_follow_the_last_one_is_refused() -> None:
    case_id = uuid.uuid4()
    trail, kept = emitter()
    with trail.attempt(case_id, 1):
        await trail.emit(started(case_id))
        with pytest.raises(CasetrailError, match="does not follow the last one emitted"):
            await trail.emit(cycle(case_id, 2, 1))
    assert len(kept.sent) == 1


async def test_parked_failed_and_handed_back_attempts_leave_no_chain_behind() -> None:
    """An attempt that stops without a terminal event (parked for a person, handed back
    to the queue, or raising) releases its chain: a worker holds only running ones."""
    trail, _ = emitter()
    for n in range(2_000):
        case_id = uuid.uuid4()
        try:
            with trail.attempt(case_id, 1):
                await trail.emit(started(case_id))
                await trail.emit(cycle(case_id, 1, 0))
                assert trail.open_chains == 1
                if n % 2:
                    raise RuntimeError("the attempt crashed")
        except RuntimeError:
            pass
    assert trail.open_chains == 0


async def test_a_new_attempt_of_a_released_case_starts_its_own_chain() -> None:
    case_id = uuid.uuid4()
    trail, kept = emitter()
    with trail.attempt(case_id, 1):
        await trail.emit(started(case_id))
    with trail.attempt(case_id, 2):
        await trail.emit(started(case_id, attempt=2))
        await trail.emit(cycle(case_id, 1, 0, attempt=2))
    assert [i.prev_hash for _, _, i in kept.sent][1:] == [GENESIS, kept.sent[1][2].hash]


async def test_sensitive_values_are_replaced_only_while_the_attempt_runs() -> None:
    case_id = uuid.uuid4()
    trail, kept = emitter()
    redaction = Redaction.of({"{{pii:name}}": "Ada Lovelace"})
    event = make_event(case_id, 1, 0, started(case_id).payload.model_copy(
        update={"input": {"applicantId": "A-1", "name": "Ada Lovelace"}}))
    with trail.attempt(case_id, 1, redaction):
        await trail.emit(event)
        assert trail.redact(case_id, '{"who":"Ada Lovelace"}') == '{"who":"{{pii:name}}"}'
    assert b"Ada Lovelace" not in kept.sent[0][1]
    assert b"{{pii:name}}" in kept.sent[0][1]
    assert trail.redact(case_id, '{"who":"Ada Lovelace"}') == '{"who":"Ada Lovelace"}'


async def test_an_oversized_event_is_never_handed_on() -> None:
    case_id = uuid.uuid4()
    trail, kept = emitter(max_event_bytes=200)
    with trail.attempt(case_id, 1), pytest.raises(PublishRejected, match="byte limit"):
        await trail.emit(started(case_id))
    assert kept.sent == []


async def test_an_erasure_is_chained_after_the_stored_last_event() -> None:
    case_id = uuid.uuid4()
    trail, kept = emitter()
    stored = "ab" * 32
    erased = make_event(case_id, 1, 3, CaseErasedPayload(
        erased_by="dpo", erased_at=started(case_id).occurred_at, placeholders=["{{pii:x}}"]))
    await trail.append(erased, stored)
    (_, body, integrity), = kept.sent
    assert integrity.prev_hash == stored
    assert integrity.hash == chain_hash(stored, body)
    assert trail.open_chains == 0
