"""What is taken as a genuine event: only events the worker signed.

The event-log consumer checks each message before it can touch ``event_log`` or
``cases`` (a message that fails any check is dead-lettered with the reason), and the
API checks each live event before a stream shows it (``casetrail.adapters.bus.watch``: a stream
must not show what the record would refuse):

1. it was published by the worker's broker identity (AMQP ``user_id``, which the
   broker itself checks against the publishing connection);
2. its body is a current-version event envelope (an unsigned version-1 event is
   refused: there is no downgrade path around signing);
3. its ``x-casetrail-integrity`` header is well formed, the hash is
   ``SHA-256(prevHash || 0x0A || body)`` over the bytes received (never
   re-canonicalised), the key is registered and not retired, and the Ed25519
   signature verifies.

The chain link to the previous event and completeness are checked by ``verify``
over the stored trail (one event here cannot know whether its predecessor arrives).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from casetrail.contract.dead_letters import DeadLetterCode
from casetrail.contract.events import InvalidEvent, SignedEvent, event_and_payload_from_json
from casetrail.contract.integrity import (
    HEADER,
    Integrity,
    IntegrityError,
    chain_hash,
    signature_valid,
)
from casetrail.trail.verification import PublicKey

log = logging.getLogger("casetrail.consumer")

KEY_REFRESH_SECONDS = 1.0
"""An unknown key id makes the consumer read the registered keys again, at most this often."""


class Refused(Exception):
    """A message that is not a genuine event; ``reason`` goes with its dead letter."""

    def __init__(self, reason: str, code: DeadLetterCode) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code
        """The reason's class: foreign_sender, unreadable, unsigned, bad_integrity,
        hash_mismatch, unknown_key, retired_key, bad_signature."""


class KeySource(Protocol):
    """Where the registered keys are read from (the store's ``KeyRegistry``)."""

    async def all(self) -> list[PublicKey]: ...


@dataclass
class KeyRing:
    """The registered signing keys, as the consumer last read them (``registry`` None:
    a fixed set, never read again)."""

    registry: KeySource | None
    keys: dict[str, PublicKey] = field(default_factory=dict)
    _read_at: float = float("-inf")

    async def refresh(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if self.registry is None:
            return
        if force or now - self._read_at >= KEY_REFRESH_SECONDS:
            self._read_at = now
            self.keys = {k.key_id: k for k in await self.registry.all()}

    async def knows_all(self, key_ids: set[str]) -> None:
        """Read the keys again if one of ``key_ids`` is not known yet (a worker that
        registered its key since the last read). Reads are at most one a second, so a
        batch that arrives sooner waits for the next read rather than refusing a key
        that may have been registered a moment ago.

        After waiting, the read is forced: a timer may fire a hair early (uvloop's are
        in milliseconds), and a read skipped as "too soon" would refuse the key. Each
        batch that waits reads for itself, so none is checked against the keys from
        before another batch's read that is still in progress."""
        if key_ids <= self.keys.keys():
            return
        wait = self._read_at + KEY_REFRESH_SECONDS - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        await self.refresh(force=True)


@dataclass(frozen=True)
class Admission:
    """The checks, for one worker identity and a ring of keys."""

    worker_user: str
    keys: KeyRing

    def key_id_of(self, headers: Mapping[str, Any], user_id: str | None) -> str | None:
        """The key a message says it was signed with, if the worker published it (a
        message from anyone else never makes the consumer read the keys again)."""
        if user_id != self.worker_user:
            return None
        value = headers.get(HEADER)
        key = value.get("keyId") if isinstance(value, dict) else None
        return key.decode() if isinstance(key, bytes) else key if isinstance(key, str) else None

    def admit(self, body: bytes, headers: Mapping[str, Any], user_id: str | None
              ) -> SignedEvent:
        """The signed event, or ``Refused`` with the reason."""
        self._check_sender(user_id)
        try:
            event, payload = event_and_payload_from_json(body)
        except InvalidEvent as exc:
            raise Refused(str(exc), DeadLetterCode.UNREADABLE) from None
        return SignedEvent(event, body, self._check_integrity(body, headers), payload)

    def authenticate(self, body: bytes, headers: Mapping[str, Any], user_id: str | None
                     ) -> Integrity:
        """Checks 1 and 3 (who published it, hash, key and signature), for a reader that
        shows the event without storing it; ``Refused`` with the reason."""
        self._check_sender(user_id)
        return self._check_integrity(body, headers)

    def _check_sender(self, user_id: str | None) -> None:
        if user_id != self.worker_user:
            raise Refused(f"not published by the worker's broker identity "
                          f"(user_id {user_id!r}, expected {self.worker_user!r})",
                          DeadLetterCode.FOREIGN_SENDER)

    def _check_integrity(self, body: bytes, headers: Mapping[str, Any]) -> Integrity:
        if HEADER not in headers:
            raise Refused(f"no {HEADER} header: the event is not signed", DeadLetterCode.UNSIGNED)
        try:
            integrity = Integrity.from_json(headers[HEADER])
        except IntegrityError as exc:
            raise Refused(str(exc), DeadLetterCode.BAD_INTEGRITY) from None
        if chain_hash(integrity.prev_hash, body) != integrity.hash:
            raise Refused("hash_mismatch: the body does not hash to integrity.hash",
                          DeadLetterCode.HASH_MISMATCH)
        key = self.keys.keys.get(integrity.key_id)
        if key is None:
            raise Refused(f"unknown_key: key {integrity.key_id} is not registered",
                          DeadLetterCode.UNKNOWN_KEY)
        if key.not_valid_after is not None:
            raise Refused(f"retired_key: key {integrity.key_id} is retired",
                          DeadLetterCode.RETIRED_KEY)
        if not signature_valid(key.public_key, integrity.hash, integrity.sig):
            raise Refused(f"bad_signature: the signature does not verify under key "
                          f"{integrity.key_id}", DeadLetterCode.BAD_SIGNATURE)
        return integrity
