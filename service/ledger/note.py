"""Checkpoints as signed notes: C2SP ``tlog-checkpoint`` bodies in C2SP ``signed-note``
envelopes, Ed25519 log signatures and ``cosignature/v1`` witness cosignatures. No I/O.

- Key names and keys are written as Go's ``golang.org/x/mod/sumdb/note`` writes them: a
  verifier key ``<name>+<key hash, 8 hex>+<base64(type || public key)>``, a signer key
  ``PRIVATE+KEY+<name>+<key hash>+<base64(type || seed)>``. The key hash is the first
  four bytes of ``SHA-256(name || 0x0A || type || public key)``; the type byte is
  ``0x01`` for an Ed25519 log key and ``0x04`` for an Ed25519 cosigner (c2sp.org/
  signed-note, c2sp.org/tlog-cosignature).
- A note is its text (UTF-8, ending in a newline), a blank line, then one line per
  signature: ``— <name> <base64(key hash || signature)>``. A log signature is Ed25519
  over the text; a cosignature is Ed25519 over ``cosignature/v1\\ntime <t>\\n`` followed
  by the text, and carries ``t`` (8 bytes, big-endian) before the signature.
- A checkpoint's text is ``<origin>\\n<tree size>\\n<base64 root>\\n``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

ED25519 = 0x01
"""Signature type of an Ed25519 signed-note key (the log's)."""
COSIGNATURE_V1 = 0x04
"""Signature type of an Ed25519 ``cosignature/v1`` key (a witness's)."""

_DASH = "\u2014 "
_NAME = re.compile(r"^[^\s+]+$")
_B64 = re.compile(r"^[A-Za-z0-9+/]+={0,2}$")


class NoteError(ValueError):
    """A key, note or checkpoint that is malformed, or a signature that does not verify."""


def _b64decode(text: str, what: str) -> bytes:
    if not _B64.match(text):
        raise NoteError(f"{what} is not base64")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise NoteError(f"{what} is not base64") from None


def key_hash(name: str, kind: int, public_key: bytes) -> bytes:
    return hashlib.sha256(name.encode() + b"\n" + bytes([kind]) + public_key).digest()[:4]


def _check_name(name: str) -> str:
    if not name or not _NAME.match(name):
        raise NoteError(f"a key name is non-empty, without spaces or '+': {name!r}")
    return name


@dataclass(frozen=True)
class Verifier:
    """A public key with its name and type: what a note's reader trusts."""

    name: str
    kind: int
    public_key: bytes

    @property
    def hash(self) -> bytes:
        return key_hash(self.name, self.kind, self.public_key)

    def text(self) -> str:
        body = base64.b64encode(bytes([self.kind]) + self.public_key).decode()
        return f"{self.name}+{self.hash.hex()}+{body}"

    @classmethod
    def parse(cls, text: str) -> Verifier:
        """``<name>+<hash>+<base64 key>``; ``NoteError`` when malformed or inconsistent."""
        name, sep1, rest = text.strip().partition("+")
        hex_hash, sep2, encoded = rest.partition("+")
        if not (sep1 and sep2):
            raise NoteError("a verifier key is <name>+<key hash>+<base64 key>")
        raw = _b64decode(encoded, "the verifier key")
        if len(raw) != 33 or raw[0] not in (ED25519, COSIGNATURE_V1):
            raise NoteError("a verifier key here is an Ed25519 key (type 0x01 or 0x04, "
                            "32 bytes)")
        verifier = cls(_check_name(name), raw[0], raw[1:])
        if verifier.hash.hex() != hex_hash.lower() or len(hex_hash) != 8:
            raise NoteError(f"the verifier key's hash {hex_hash} does not match its key")
        return verifier

    def verify(self, message: bytes, signature: bytes) -> bool:
        try:
            Ed25519PublicKey.from_public_bytes(self.public_key).verify(signature, message)
        except (InvalidSignature, ValueError):
            return False
        return True


@dataclass(frozen=True)
class NoteSigner:
    """An Ed25519 private key with its name and type."""

    name: str
    kind: int
    seed: bytes = field(repr=False)

    @classmethod
    def generate(cls, name: str, kind: int = ED25519) -> NoteSigner:
        from cryptography.hazmat.primitives.serialization import NoEncryption, PrivateFormat

        seed = Ed25519PrivateKey.generate().private_bytes(Encoding.Raw, PrivateFormat.Raw,
                                                           NoEncryption())
        return cls(_check_name(name), kind, seed)

    @property
    def _key(self) -> Ed25519PrivateKey:
        return Ed25519PrivateKey.from_private_bytes(self.seed)

    @property
    def verifier(self) -> Verifier:
        public = self._key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        return Verifier(self.name, self.kind, public)

    def text(self) -> str:
        body = base64.b64encode(bytes([self.kind]) + self.seed).decode()
        return f"PRIVATE+KEY+{self.name}+{self.verifier.hash.hex()}+{body}"

    @classmethod
    def parse(cls, text: str) -> NoteSigner:
        parts = text.strip().split("+", 4)
        if len(parts) != 5 or parts[:2] != ["PRIVATE", "KEY"]:
            raise NoteError("a signer key is PRIVATE+KEY+<name>+<key hash>+<base64 key>")
        raw = _b64decode(parts[4], "the signer key")
        if len(raw) != 33 or raw[0] not in (ED25519, COSIGNATURE_V1):
            raise NoteError("a signer key here is an Ed25519 key (type 0x01 or 0x04)")
        signer = cls(_check_name(parts[2]), raw[0], raw[1:])
        if signer.verifier.hash.hex() != parts[3].lower():
            raise NoteError("the signer key's hash does not match its key")
        return signer

    def sign(self, message: bytes) -> bytes:
        return self._key.sign(message)


@dataclass(frozen=True)
class Signature:
    """One signature line of a note."""

    name: str
    hash: bytes
    signature: bytes
    """After the key hash: 64 bytes (log), or 8 + 64 (cosignature: timestamp first)."""

    def line(self) -> str:
        return f"{_DASH}{self.name} {base64.b64encode(self.hash + self.signature).decode()}\n"

    @property
    def timestamp(self) -> int | None:
        return struct.unpack(">Q", self.signature[:8])[0] if len(self.signature) == 72 else None


@dataclass(frozen=True)
class Note:
    text: str
    signatures: tuple[Signature, ...]

    def render(self) -> str:
        return self.text + "\n" + "".join(s.line() for s in self.signatures)

    @classmethod
    def parse(cls, note: str) -> Note:
        """A signed note; ``NoteError`` when it is not one."""
        if "\r" in note or not note.endswith("\n"):
            raise NoteError("a note ends with a newline and has no carriage returns")
        text, sep, tail = note.rpartition("\n\n")
        if not sep:
            raise NoteError("a note has its text, a blank line, then its signatures")
        text += "\n"
        signatures = []
        for line in tail.splitlines():
            if not line.startswith(_DASH):
                raise NoteError(f"not a signature line: {line[:60]!r}")
            name, space, encoded = line[len(_DASH):].partition(" ")
            raw = _b64decode(encoded, "a signature")
            if not space or not _NAME.match(name) or len(raw) < 5:
                raise NoteError(f"not a signature line: {line[:60]!r}")
            signatures.append(Signature(name, raw[:4], raw[4:]))
        if not signatures:
            raise NoteError("a note has at least one signature")
        return cls(text, tuple(signatures))

    def signed_by(self, verifier: Verifier) -> Signature | None:
        """The signature of ``verifier`` on this note when one verifies, else ``None``."""
        for sig in self.signatures:
            if sig.name != verifier.name or sig.hash != verifier.hash:
                continue
            if verifier.kind == COSIGNATURE_V1:
                if sig.timestamp is not None and verifier.verify(
                        cosigned_message(self.text, sig.timestamp), sig.signature[8:]):
                    return sig
            elif len(sig.signature) == 64 and verifier.verify(self.text.encode(),
                                                              sig.signature):
                return sig
        return None

    def with_signatures(self, *extra: Signature) -> Note:
        known = {(s.name, s.hash) for s in self.signatures}
        return Note(self.text, self.signatures + tuple(s for s in extra
                                                       if (s.name, s.hash) not in known))


def sign(text: str, signer: NoteSigner) -> Note:
    if not text.endswith("\n") or "\n\n" in text:
        raise NoteError("a note's text ends with a newline and has no blank line")
    return Note(text, (Signature(signer.name, signer.verifier.hash,
                                 signer.sign(text.encode())),))


def cosigned_message(text: str, timestamp: int) -> bytes:
    return f"cosignature/v1\ntime {timestamp}\n{text}".encode()


def cosign(note: Note, signer: NoteSigner, timestamp: int) -> Signature:
    """A witness's ``cosignature/v1`` on ``note``'s text at ``timestamp`` (POSIX seconds)."""
    if signer.kind != COSIGNATURE_V1:
        raise NoteError("a cosignature needs a cosignature/v1 key (type 0x04)")
    signature = signer.sign(cosigned_message(note.text, timestamp))
    return Signature(signer.name, signer.verifier.hash,
                     struct.pack(">Q", timestamp) + signature)


# -- checkpoints ------------------------------------------------------------------------

@dataclass(frozen=True)
class Checkpoint:
    """A tree head: the log's origin, its size and its root hash."""

    origin: str
    size: int
    root: bytes

    def text(self) -> str:
        return f"{self.origin}\n{self.size}\n{base64.b64encode(self.root).decode()}\n"

    @classmethod
    def parse(cls, text: str) -> Checkpoint:
        lines = text.split("\n")
        if len(lines) < 4 or lines[-1] != "":
            raise NoteError("a checkpoint is origin, tree size and root hash, one a line")
        origin, size, root = lines[:3]
        if not origin or not re.fullmatch(r"0|[1-9][0-9]{0,19}", size):
            raise NoteError("a checkpoint's second line is its tree size in decimal")
        raw = _b64decode(root, "the root hash")
        if len(raw) != 32:
            raise NoteError("a checkpoint's root hash is 32 bytes")
        return cls(origin, int(size), raw)

    def describe(self) -> str:
        return f"{self.origin} size {self.size} root {base64.b64encode(self.root).decode()}"


def open_checkpoint(note_text: str, log: Verifier) -> tuple[Checkpoint, Note]:
    """A signed checkpoint checked against the log's key, whose name must be its origin;
    ``NoteError`` says what is wrong."""
    note = Note.parse(note_text)
    if note.signed_by(log) is None:
        raise NoteError(f"the checkpoint carries no valid signature of {log.name}")
    checkpoint = Checkpoint.parse(note.text)
    if checkpoint.origin != log.name:
        raise NoteError(f"the checkpoint's origin {checkpoint.origin!r} is not the log "
                        f"key's name {log.name!r}")
    return checkpoint, note


def open_with_any(note_text: str, log_keys: Sequence[Verifier]) -> tuple[Checkpoint, Note]:
    """``open_checkpoint`` with the first of ``log_keys`` that signed it (a log's keys
    across a rotation); ``NoteError`` with every key's reason when none did."""
    errors = []
    for key in log_keys:
        try:
            return open_checkpoint(note_text, key)
        except NoteError as exc:
            errors.append(str(exc))
    raise NoteError("; ".join(errors) or "no log key to check the checkpoint with")


# -- proofs (c2sp.org/tlog-proof) -------------------------------------------------------

PROOF_HEADER = "c2sp.org/tlog-proof@v1"


@dataclass(frozen=True)
class TlogProof:
    index: int
    path: tuple[bytes, ...]
    checkpoint: str
    """The signed note, verbatim."""

    def render(self) -> str:
        lines = [PROOF_HEADER, f"index {self.index}"]
        lines += [base64.b64encode(h).decode() for h in self.path]
        return "\n".join(lines) + "\n\n" + self.checkpoint

    @classmethod
    def parse(cls, text: str) -> TlogProof:
        head, sep, checkpoint = text.partition("\n\n")
        lines = head.split("\n")
        if not sep or lines[0] != PROOF_HEADER:
            raise NoteError(f"a proof starts with {PROOF_HEADER} and holds a checkpoint")
        rest = lines[1:]
        if rest and rest[0].startswith("extra "):
            rest = rest[1:]
        if not rest or not re.fullmatch(r"index (0|[1-9][0-9]{0,19})", rest[0]):
            raise NoteError("a proof names its index: index <n>")
        path = tuple(_b64decode(h, "a proof hash") for h in rest[1:])
        if any(len(h) != 32 for h in path):
            raise NoteError("a proof's hashes are 32 bytes each")
        return cls(int(rest[0][6:]), path, checkpoint)
