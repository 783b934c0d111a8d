"""Writing the trail: every event a case emits is redacted, chained to the one before it
in its attempt and signed here, then handed as bytes to whatever carries it (on
RabbitMQ, ``casetrail.adapters.bus.publisher.EventPublisher``, which only publishes).

An attempt's events come in seq order (the engine emits one after the other), so the
chain's head is kept from one event to the next. It is released when the attempt stops
emitting, however it stops: a terminal event, a park for a person, a hand-back to the
queue or a crash of the attempt (``TrailEmitter.attempt``), so a worker that has run a
million attempts holds the heads of the ones running now and no others.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from casetrail.contract.events import MAX_EVENT_BYTES, Event
from casetrail.contract.integrity import GENESIS, Integrity, Signer, canonical
from casetrail.errors import CasetrailError, PublishRejected


class SealedSink(Protocol):
    """Carries an event already redacted and signed: its canonical bytes and their
    integrity; returns once the event is durable."""

    async def publish_sealed(self, event: Event, body: bytes, integrity: Integrity) -> None: ...


class Redactor(Protocol):
    """A case's sensitive values, replaced by their placeholders (casetrail.privacy)."""

    def replace_in(self, data: Any) -> Any: ...

    def apply(self, body: bytes) -> bytes: ...


Chain = tuple[uuid.UUID, int]
"""An attempt's chain: case id and attempt."""


@dataclass
class TrailEmitter:
    """The engine's ``EventSink``: redacts, chains and signs each event, then hands it to
    ``out``. Events of an attempt opened with ``attempt`` have the case's sensitive values
    replaced; an event of a chain whose head is not the event before it is refused."""

    out: SealedSink
    signer: Signer
    max_event_bytes: int = MAX_EVENT_BYTES
    """Never handed on larger (the engine keeps a turn's results within it; this is the
    last guard)."""
    _redactions: dict[uuid.UUID, Redactor] = field(default_factory=dict)
    _heads: dict[Chain, tuple[int, str]] = field(default_factory=dict)

    @property
    def open_chains(self) -> int:
        """How many attempts' heads are held (the attempts emitting now)."""
        return len(self._heads)

    @contextmanager
    def attempt(self, case_id: uuid.UUID, attempt: int,
                redaction: Redactor | None = None) -> Iterator[None]:
        """While an attempt runs: its events are redacted with ``redaction``; when it
        stops, for whatever reason, its chain is released."""
        if redaction is not None:
            self._redactions[case_id] = redaction
        try:
            yield
        finally:
            self._redactions.pop(case_id, None)
            self.release(case_id, attempt)

    def release(self, case_id: uuid.UUID, attempt: int) -> None:
        """Forget the attempt's head: it emits no more (a new attempt starts a new chain)."""
        self._heads.pop((case_id, attempt), None)

    async def emit(self, event: Event) -> None:
        chain = (event.case_id, event.attempt)
        if event.seq == 0:
            prev_hash = GENESIS
        else:
            head = self._heads.get(chain)
            if head is None or head[0] != event.seq - 1:
                raise CasetrailError(
                    f"event {event.seq} of case {event.case_id} attempt {event.attempt} does "
                    f"not follow the last one emitted ({head[0] if head else 'none'})")
            prev_hash = head[1]
        redaction = self._redactions.get(event.case_id)
        body = event.to_json() if redaction is None \
            else canonical(redaction.replace_in(event.wire_values()))
        integrity = self._signed(event, body, prev_hash)
        if event.is_terminal:
            self._heads.pop(chain, None)
        else:
            self._heads[chain] = (event.seq, integrity.hash)
        await self.out.publish_sealed(event, body, integrity)

    async def append(self, event: Event, after_hash: str) -> None:
        """Emit ``event`` after a trail's stored last event (its chain hash
        ``after_hash``): the record of an erasure, written once the case has ended."""
        body = event.to_json()
        await self.out.publish_sealed(event, body, self._signed(event, body, after_hash))

    def redact(self, case_id: uuid.UUID, text: str) -> str:
        """``text`` (JSON) with the case's sensitive values replaced, as events have them."""
        redaction = self._redactions.get(case_id)
        return text if redaction is None else redaction.apply(text.encode()).decode()

    def _signed(self, event: Event, body: bytes, prev_hash: str) -> Integrity:
        if len(body) > self.max_event_bytes:
            raise PublishRejected(f"event {event.seq} of case {event.case_id} is {len(body):,} "
                                  f"bytes, over the {self.max_event_bytes:,} byte limit: not "
                                  "published")
        return self.signer.seal(prev_hash, body)
