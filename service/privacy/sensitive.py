"""Sensitive fields: marked in an agent's input model, kept out of every event, stored
encrypted under a per-case key that erasing a case destroys.

- An input model marks a field ``Annotated[str, Sensitive()]``. When a case is
  started, each marked value is replaced in the stored input by a placeholder named
  after its place, ``[pii:applicantName]`` (stable: the same place, the same
  placeholder), and the values go to ``case_secrets`` encrypted (AES-256-GCM) under a
  fresh data key, itself wrapped (AES-256-GCM) by the master key from the environment
  (``CASETRAIL_MASTER_KEY``). Both ciphertexts are bound to the case id.
- The worker opens the values to run the case (the model and the tools see them) and
  replaces every occurrence of each value by its placeholder in every event it
  publishes — input, reasoning text, tool arguments and results, the answer — before
  the event is hashed and signed, so the trail never held them.
- ``pii:read`` callers get them back in API responses (each such read is logged);
  erasing a case destroys its wrapped key and ciphertext: the placeholders then stand
  for nothing anyone can recover, and every hash still verifies.

Substitution finds a value where it is written as given (a value shorter than three
characters only where a whole string is that value). A model that paraphrases it (a
nickname, another spelling, initials, another case) is not caught: say so to whoever
relies on it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import types
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Union, get_args, get_origin

import orjson
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from casetrail.contract.integrity import canonical
from casetrail.errors import PermanentError


class Sensitive:
    """Marks an input field whose value is personal data: ``Annotated[str, Sensitive()]``.
    Its JSON schema says so (``"x-casetrail-sensitive": true``)."""

    def __repr__(self) -> str:
        return "Sensitive()"

    def __get_pydantic_json_schema__(self, schema: Any, handler: Any) -> Any:
        produced = handler(schema)
        produced["x-casetrail-sensitive"] = True
        return produced


PLACEHOLDER = re.compile(r"\[pii:[A-Za-z0-9_.]+\]")


def placeholder(path: str) -> str:
    return f"[pii:{path}]"


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The models an annotation holds: ``M``, ``list[M]``, ``M | None``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    if get_origin(annotation) in (list, tuple, Union, types.UnionType):
        return [m for arg in get_args(annotation) for m in _models_in(arg)]
    return []


def _marked(field: FieldInfo) -> bool:
    """Whether a field is marked ``Sensitive()``: on itself, or on a member of its union
    (``Annotated[str, Sensitive()] | None``, whose mark pydantic keeps in the union)."""
    if any(isinstance(m, Sensitive) for m in field.metadata):
        return True
    if get_origin(field.annotation) not in (Union, types.UnionType):
        return False
    return any(get_origin(arg) is Annotated and any(isinstance(m, Sensitive)
                                                     for m in arg.__metadata__)
               for arg in get_args(field.annotation))


def sensitive_field(model: type[BaseModel], name: str) -> bool:
    """Whether ``model``'s top-level field ``name`` (its JSON name) is marked sensitive."""
    for key, field in model.model_fields.items():
        if (field.alias or key) == name:
            return _marked(field)
    return False


def sensitive_fields(model: type[BaseModel]) -> bool:
    """Whether ``model`` (or a model inside it) marks any field sensitive."""
    for field in model.model_fields.values():
        if _marked(field):
            return True
        if any(sensitive_fields(inner) for inner in _models_in(field.annotation)):
            return True
    return False


def split(model: type[BaseModel], data: Mapping[str, Any]) -> tuple[dict[str, Any],
                                                                      dict[str, str]]:
    """``data`` (already valid for ``model``, by alias) with each sensitive value replaced
    by its placeholder, and ``{placeholder: value}``."""
    values: dict[str, str] = {}
    return _split(model, dict(data), "", values), values


def _split(model: type[BaseModel], data: dict[str, Any], prefix: str,
           values: dict[str, str]) -> dict[str, Any]:
    out = dict(data)
    for name, field in model.model_fields.items():
        key = field.alias or name
        if key not in out:
            continue
        path = f"{prefix}{key}"
        if _marked(field):
            if isinstance(out[key], str) and out[key]:
                values[placeholder(path)] = out[key]
                out[key] = placeholder(path)
            continue
        inner = _models_in(field.annotation)
        if not inner:
            continue
        if isinstance(out[key], dict):
            out[key] = _split(inner[0], out[key], f"{path}.", values)
        elif isinstance(out[key], list):
            out[key] = [_split(inner[0], item, f"{path}.{i}.", values)
                        if isinstance(item, dict) else item
                        for i, item in enumerate(out[key])]
    return out


def restore(obj: Any, values: Mapping[str, str]) -> Any:
    """``obj`` with every placeholder in every string replaced by its value."""
    if not values:
        return obj
    if isinstance(obj, str):
        return PLACEHOLDER.sub(lambda m: values.get(m.group(0), m.group(0)), obj)
    if isinstance(obj, dict):
        return {k: restore(v, values) for k, v in obj.items()}
    if isinstance(obj, list):
        return [restore(v, values) for v in obj]
    return obj


SHORTEST_IN_TEXT = 3
"""A value shorter than this is replaced only where a string is exactly it, never inside
text (a one-letter name would otherwise rewrite every word holding that letter)."""


@dataclass(frozen=True)
class Redaction:
    """Replaces a case's sensitive values by their placeholders in an event's canonical
    bytes, before it is signed: inside every string of the event (object keys too),
    never in its structure."""

    pairs: tuple[tuple[str, str], ...]
    _probes: tuple[bytes, ...]

    @classmethod
    def of(cls, values: Mapping[str, str]) -> Redaction:
        # Longest first, so a value inside another is not replaced in it first.
        ordered = sorted(((v, name) for name, v in values.items() if v),
                         key=lambda pair: -len(pair[0]))
        # A value as it is written inside a JSON string, escapes included: the
        # quick test of whether an event holds it at all.
        return cls(tuple(ordered), tuple(orjson.dumps(v)[1:-1] for v, _ in ordered))

    def apply(self, body: bytes) -> bytes:
        """``body`` (JSON) with the values replaced, canonical again if any was there."""
        if not any(probe in body for probe in self._probes):
            return body  # most events of a case hold none of its values
        return canonical(self._walk(orjson.loads(body)))

    def replace_in(self, data: Any) -> Any:
        """``data`` (an event as JSON values, before it is made canonical) with the
        values replaced: the event is then serialized once, not twice."""
        try:
            text = orjson.dumps(data)
        except orjson.JSONEncodeError:  # an integer beyond 64 bits: look everywhere
            return self._walk(data)
        if not any(probe in text for probe in self._probes):
            return data
        return self._walk(data)

    def hide(self, data: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
        """``data`` (a tool call's arguments) with the values replaced, and
        ``{placeholder: value}`` for each placeholder it then holds: what a tool request
        carries in the open, and what it carries sealed."""
        hidden = self.replace_in(dict(data))
        text = orjson.dumps(hidden)
        return hidden, {name: value for value, name in self.pairs if name.encode() in text}

    def _text(self, text: str) -> str:
        for value, name in self.pairs:
            if text == value:
                return name
            if len(value) >= SHORTEST_IN_TEXT and value in text:
                text = text.replace(value, name)
        return text

    def _walk(self, node: Any) -> Any:
        if isinstance(node, str):
            return self._text(node)
        if isinstance(node, dict):
            return {self._text(k): self._walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [self._walk(v) for v in node]
        return node


@dataclass(frozen=True)
class SealedValues:
    """A case's sensitive values as stored: nothing here is readable without the
    master key, and nothing at all once ``wrapped_key`` is gone."""

    master_key_id: str
    wrapped_key: bytes
    ciphertext: bytes


class Vault:
    """Seals and opens a case's values with the master key."""

    def __init__(self, master_key: bytes) -> None:
        if len(master_key) != 32:
            raise PermanentError("the master key must be 32 bytes (base64 of 32 random bytes)")
        self._master = AESGCM(master_key)
        self.key_id = hashlib.sha256(master_key).hexdigest()[:16]
        self._digest_key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
                                info=b"casetrail request digest").derive(master_key)
        self._key_digest_key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
                                    info=b"casetrail business key").derive(master_key)

    def key_digest(self, field: str, value: str) -> str:
        """A sensitive business key as kept and searched (``GET /cases?key=``): HMAC-SHA256
        under a key derived from the master key, so the table never holds the value."""
        return "hmac:" + hmac.new(self._key_digest_key, f"{field}\x00{value}".encode(),
                                  hashlib.sha256).hexdigest()

    def request_digest(self, request: bytes) -> str:
        """HMAC-SHA256 of a start request (its idempotency check), under a key derived
        from the master key: without it, the digest reveals nothing of the input."""
        return hmac.new(self._digest_key, request, hashlib.sha256).hexdigest()

    @classmethod
    def from_text(cls, text: str) -> Vault:
        try:
            return cls(base64.b64decode(text, validate=True))
        except ValueError:
            raise PermanentError("the master key is not base64") from None

    @staticmethod
    def generate_text() -> str:
        return base64.b64encode(AESGCM.generate_key(256)).decode()

    def seal(self, case_id: uuid.UUID, values: Mapping[str, str]) -> SealedValues:
        data_key = AESGCM.generate_key(256)
        nonce, key_nonce = os.urandom(12), os.urandom(12)
        ciphertext = nonce + AESGCM(data_key).encrypt(nonce, orjson.dumps(dict(values)),
                                                      case_id.bytes)
        wrapped = key_nonce + self._master.encrypt(key_nonce, data_key,
                                                   b"casetrail-data-key:" + case_id.bytes)
        return SealedValues(self.key_id, wrapped, ciphertext)

    def open(self, case_id: uuid.UUID, sealed: SealedValues) -> dict[str, str]:
        if sealed.master_key_id != self.key_id:
            raise PermanentError(f"case {case_id}'s values are sealed with master key "
                                 f"{sealed.master_key_id}, not {self.key_id}")
        try:
            data_key = self._master.decrypt(sealed.wrapped_key[:12], sealed.wrapped_key[12:],
                                            b"casetrail-data-key:" + case_id.bytes)
            plain = AESGCM(data_key).decrypt(sealed.ciphertext[:12], sealed.ciphertext[12:],
                                             case_id.bytes)
        except InvalidTag:
            raise PermanentError(f"case {case_id}'s values do not open with this master key "
                                 "(altered, or another case's)") from None
        values: dict[str, str] = orjson.loads(plain)
        return values
