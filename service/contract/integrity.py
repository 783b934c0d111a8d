"""How an event proves itself: canonical bytes, a hash chain per attempt, Ed25519.

No I/O. The worker signs with it as it emits, the consumer checks each event with it
before storing, and ``verify`` / ``verify-bundle`` check whole trails with it.

- The body of an event is ``JCS(envelope without "integrity")``: RFC 8785 canonical
  JSON (the ``rfc8785`` package) in UTF-8, so a subscriber still reads it with
  ``json.loads`` and every verifier hashes the same bytes.
- ``hash = SHA-256(prevHash || 0x0A || body)``, where ``prevHash`` is the previous
  event's hash of the same attempt as 64 lowercase hex ASCII characters (64 ``0`` for
  seq 0); ``hash`` is written the same way. Each attempt is one chain.
- ``sig`` = Ed25519 over the 32 raw hash bytes, base64url without padding; a public
  key is its 32 raw bytes (base64 with padding where it is written down); ``keyId`` =
  the first 16 hex characters of SHA-256 of those 32 bytes.

The integrity object travels beside the body (AMQP header ``x-casetrail-integrity``)
and inside the envelope where REST and bundles show an event. docs/bundle.md has the
same rules with test vectors.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from dataclasses import dataclass
from typing import Any

import orjson
import rfc8785
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
)
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
    load_pem_private_key,
)
from nacl.exceptions import BadSignatureError
from nacl.signing import SigningKey, VerifyKey

HEADER = "x-casetrail-integrity"
"""The AMQP header an event's integrity travels in."""

GENESIS = "0" * 64
"""``prevHash`` of the first event (seq 0) of every attempt."""

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_HEX16 = re.compile(r"^[0-9a-f]{16}$")
_B64URL = re.compile(r"^[A-Za-z0-9_-]{86}$")  # 64 signature bytes, no padding


class IntegrityError(ValueError):
    """An integrity object that is malformed (not one that fails to verify)."""


SAFE_INTEGER = 2**53 - 1
"""RFC 8785 numbers are IEEE doubles: integers beyond this are not exact in them."""


def _representable(value: Any) -> Any:
    """``value`` with every integer beyond ±(2**53 - 1) written as a double when that is
    exact, else as its decimal string (I-JSON's advice for such numbers)."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        if abs(value) <= SAFE_INTEGER:
            return value
        return float(value) if int(float(value)) == value else str(value)
    if isinstance(value, dict):
        return {k: _representable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_representable(v) for v in value]
    return value


class _NotPlain(Exception):
    """A value whose RFC 8785 bytes ``orjson`` would not write."""


_FIXED = (1e-5, 1e15)
"""Where both ``orjson`` and ECMAScript write a non-integral double in fixed notation
with the same shortest digits (ECMAScript from 1e-6 to 1e21, ``orjson`` narrower)."""


def _plain(value: Any) -> Any:
    """``value`` as ``orjson`` (sorted keys) writes its RFC 8785 bytes: an integral
    double becomes the integer JCS writes (``5.0`` → ``5``, ``-0.0`` → ``0``). Raises
    ``_NotPlain`` wherever the two could differ: a double outside ``_FIXED``, an integer
    beyond ±(2**53 - 1), a key with a character beyond the BMP (JCS sorts keys by UTF-16
    code units, ``orjson`` by code points: they disagree only there), any other type."""
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return value
    if kind is int:
        if -SAFE_INTEGER <= value <= SAFE_INTEGER:
            return value
        raise _NotPlain
    if kind is dict:
        changed: dict[str, Any] | None = None
        for key, item in value.items():
            if type(key) is not str or (not key.isascii() and max(key) > "\uffff"):
                raise _NotPlain
            made = _plain(item)
            if made is not item:
                changed = dict(value) if changed is None else changed
                changed[key] = made
        return value if changed is None else changed
    if kind is list or kind is tuple:
        replaced: list[Any] | None = None
        for index, item in enumerate(value):
            made = _plain(item)
            if made is not item:
                replaced = list(value) if replaced is None else replaced
                replaced[index] = made
        return value if replaced is None else replaced
    if kind is float:
        if value.is_integer():
            if abs(value) <= SAFE_INTEGER:
                return int(value)
        elif _FIXED[0] <= abs(value) < _FIXED[1]:
            return value
    raise _NotPlain


def canonical(value: Any) -> bytes:
    """RFC 8785 canonical JSON of ``value``, UTF-8. An integer beyond the range a double
    holds exactly (a tool's or a model's, say) is written as a double when exact, else
    as a string; the signed bytes are then what the trail records.

    ``orjson`` writes it where its bytes are provably JCS's (``_plain``; property-tested
    against ``rfc8785`` in tests/unit/test_canonical.py), the ``rfc8785`` package elsewhere."""
    try:
        return orjson.dumps(_plain(value), option=orjson.OPT_SORT_KEYS)
    except (_NotPlain, orjson.JSONEncodeError, RecursionError):
        pass
    try:
        return rfc8785.dumps(value)
    except rfc8785.IntegerDomainError:
        return rfc8785.dumps(_representable(value))


def chain_hash(prev_hash: str, body: bytes) -> str:
    """``SHA-256(prevHash || 0x0A || body)`` as 64 lowercase hex characters."""
    return hashlib.sha256(prev_hash.encode("ascii") + b"\n" + body).hexdigest()


def key_id(public_key: bytes) -> str:
    """The first 16 hex characters of SHA-256 of the 32 raw public-key bytes."""
    return hashlib.sha256(public_key).hexdigest()[:16]


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def public_key_text(public_key: bytes) -> str:
    """A public key as written down: its 32 raw bytes, base64 with padding."""
    return base64.b64encode(public_key).decode("ascii")


def public_key_from_text(text: str) -> bytes:
    """The 32 raw bytes of a base64 public key; ``IntegrityError`` if it is not one."""
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise IntegrityError(f"not a base64 public key: {exc}") from None
    if len(raw) != 32:
        raise IntegrityError(f"an Ed25519 public key is 32 bytes, not {len(raw)}")
    return raw


@dataclass(frozen=True, slots=True)
class Integrity:
    """Where an event sits in its chain, and who signed it."""

    prev_hash: str
    hash: str
    key_id: str
    sig: str

    def as_json(self) -> dict[str, str]:
        return {"prevHash": self.prev_hash, "hash": self.hash, "keyId": self.key_id,
                "sig": self.sig}

    @classmethod
    def from_json(cls, value: object) -> Integrity:
        """Read the header's or an envelope's object; ``IntegrityError`` names what is
        malformed."""
        if not isinstance(value, dict):
            raise IntegrityError("integrity must be an object")
        fields = {}
        for name, pattern in (("prevHash", _HEX64), ("hash", _HEX64), ("keyId", _HEX16),
                              ("sig", _B64URL)):
            item = value.get(name)
            if isinstance(item, bytes):  # an AMQP long string may arrive as bytes
                item = item.decode("ascii", errors="replace")
            if not isinstance(item, str) or not pattern.match(item):
                raise IntegrityError(f"integrity.{name} is missing or malformed")
            fields[name] = item
        return cls(fields["prevHash"], fields["hash"], fields["keyId"], fields["sig"])


def signature_valid(public_key: bytes, hash_hex: str, sig: str) -> bool:
    """Whether ``sig`` is the Ed25519 signature by ``public_key`` of the 32 hash bytes.
    libsodium (PyNaCl) checks it: about 40 µs where ``cryptography`` takes about 65, on
    every event the consumer admits (docs/benchmarks.md); it also refuses small-order
    keys and non-canonical signatures, so it accepts nothing OpenSSL would refuse."""
    try:
        VerifyKey(public_key).verify(bytes.fromhex(hash_hex), _unb64url(sig))
    except (BadSignatureError, ValueError, TypeError, binascii.Error):
        return False
    return True


def message_signature_valid(public_key: bytes, message: bytes, sig: str) -> bool:
    """Whether ``sig`` is the Ed25519 signature by ``public_key`` of ``message`` itself
    (a person's action: service/trail/person_actions.py), checked by libsodium as above."""
    try:
        VerifyKey(public_key).verify(message, _unb64url(sig))
    except (BadSignatureError, ValueError, TypeError, binascii.Error):
        return False
    return True


class Signer:
    """An Ed25519 signing key: signs chain hashes as the worker emits."""

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        self._key = private_key
        self.public_key: bytes = private_key.public_key().public_bytes(
            Encoding.Raw, PublicFormat.Raw)
        self.key_id = key_id(self.public_key)
        # The same key in libsodium, which signs faster (Ed25519 is deterministic: the
        # signatures are the very bytes cryptography would make).
        self._sodium = SigningKey(private_key.private_bytes(
            Encoding.Raw, PrivateFormat.Raw, NoEncryption()))

    @classmethod
    def generate(cls) -> Signer:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_pem(cls, pem: bytes) -> Signer:
        """A key as ``to_pem`` writes it (PKCS #8 PEM, unencrypted)."""
        try:
            key = load_pem_private_key(pem, password=None)
        except (ValueError, TypeError) as exc:
            raise IntegrityError(f"not a PEM private key: {exc}") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise IntegrityError(f"not an Ed25519 key but {type(key).__name__}")
        return cls(key)

    def to_pem(self) -> bytes:
        return self._key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())

    def sign(self, hash_hex: str) -> str:
        return _b64url(self._sodium.sign(bytes.fromhex(hash_hex)).signature)

    def sign_message(self, message: bytes) -> str:
        """The signature of ``message`` itself (base64url, no padding)."""
        return _b64url(self._sodium.sign(message).signature)

    def seal(self, prev_hash: str, body: bytes) -> Integrity:
        """The integrity of ``body`` chained after ``prev_hash``."""
        digest = chain_hash(prev_hash, body)
        return Integrity(prev_hash, digest, self.key_id, self.sign(digest))
