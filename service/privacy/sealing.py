"""Sensitive values sealed to a capability: a tool request carries placeholders, as
events do, plus the values its call needs sealed to the capability's own X25519 key,
which only that capability's workers hold (docs/design.md, "Trust").

The seal is HPKE (RFC 9180, base mode: DHKEM(X25519, HKDF-SHA256), HKDF-SHA256,
AES-256-GCM) from ``cryptography``, bound to the capability and the call's idempotency
key: a sealed blob copied into another request, or to another capability, does not
open. A request no worker served in time is dropped by the broker; one set aside is
dead-lettered: either way what stays on the bus holds no value in clear.
"""

from __future__ import annotations

import base64
import binascii
import time
from collections.abc import Awaitable, Callable, Mapping

import orjson
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hpke
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from casetrail.errors import PermanentError

_SUITE = hpke.Suite(hpke.KEM.X25519, hpke.KDF.HKDF_SHA256, hpke.AEAD.AES_256_GCM)


def _info(capability: str, call_id: str) -> bytes:
    return f"casetrail tool request\x00{capability}\x00{call_id}".encode()


def generate_text() -> str:
    """A new capability key: base64 of 32 random bytes (an X25519 private key)."""
    return base64.b64encode(X25519PrivateKey.generate().private_bytes_raw()).decode()


def private_key(text: str, capability: str) -> X25519PrivateKey:
    try:
        raw = base64.b64decode(text, validate=True)
        return X25519PrivateKey.from_private_bytes(raw)
    except (binascii.Error, ValueError):
        raise PermanentError(f"the sealing key of capability {capability!r} is not base64 of "
                             "32 bytes") from None


def public_bytes(key: X25519PrivateKey) -> bytes:
    return key.public_key().public_bytes_raw()


def seal(public_key: bytes, values: Mapping[str, str], capability: str, call_id: str) -> str:
    """``values`` ({placeholder: value}) sealed to ``capability``'s key, for this call."""
    sealed = _SUITE.encrypt(orjson.dumps(dict(values)),
                            X25519PublicKey.from_public_bytes(public_key),
                            info=_info(capability, call_id))
    return base64.b64encode(sealed).decode()


def open_sealed(key: X25519PrivateKey, sealed: str, capability: str,
                call_id: str) -> dict[str, str]:
    """The values of a request's ``sealed``; ``PermanentError`` when they do not open
    (another capability's key, another call's blob, altered)."""
    try:
        plain = _SUITE.decrypt(base64.b64decode(sealed, validate=True), key,
                               info=_info(capability, call_id))
        values = orjson.loads(plain)
    except (binascii.Error, ValueError, InvalidTag, orjson.JSONDecodeError):
        raise PermanentError("the sealed values do not open with this capability's key "
                             "(sealed to another key, for another call, or altered)") from None
    if not isinstance(values, dict) or not all(isinstance(v, str) for v in values.values()):
        raise PermanentError("the sealed values are not a map of placeholders to text")
    return values


class CapabilityKeys:
    """The registered public keys, by capability, re-read at most every ``ttl`` seconds
    (a key rotated by setup reaches running workers within that)."""

    def __init__(self, fetch: Callable[[], Awaitable[dict[str, bytes]]],
                 ttl: float = 60.0) -> None:
        self._fetch, self._ttl = fetch, ttl
        self._keys: dict[str, bytes] = {}
        self._read_at = float("-inf")

    async def get(self, capability: str) -> bytes | None:
        if capability not in self._keys or time.monotonic() - self._read_at > self._ttl:
            self._keys = await self._fetch()
            self._read_at = time.monotonic()
        return self._keys.get(capability)
