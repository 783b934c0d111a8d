"""Who may do what: API keys, scopes and the principal a request acts as. No I/O.

An API key is ``ct_<keyId>_<secret>``: ``keyId`` (12 hex characters) finds the
record, and only SHA-256 of the whole key is kept, so a stolen table yields no key.
The secret is 256 random bits, which is why a fast hash is enough here.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum


class Scope(StrEnum):
    """Every scope a key or a token can hold; ``admin`` holds them all but
    ``cases:review``, which only a person holds (a key made for one, or an OIDC subject),
    never beside ``cases:start``. A route or an operation names the scope it needs by
    member, so a misspelt scope is a type error, not a door that never opens."""

    START = "cases:start"
    READ = "cases:read"
    CANCEL = "cases:cancel"
    REVIEW = "cases:review"
    MODELS_OVERRIDE = "models:override"
    PII_READ = "pii:read"
    RETENTION = "retention:manage"
    HOLDS = "holds:manage"
    BACKTESTS = "backtests:run"
    ADMIN = "admin"


SCOPES = tuple(s.value for s in Scope)
"""The scopes' names, as keys and tokens carry them."""
REVIEW_SCOPE = Scope.REVIEW
PERSON_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@:-]{0,199}$")

TENANT_PATTERN = re.compile(r"^[a-z0-9][a-z0-9-]{0,39}$")
_KEY = re.compile(r"^ct_([0-9a-f]{12})_([A-Za-z0-9_-]{43})$")


class AuthError(ValueError):
    """A key or a scope list that is not well formed."""


def new_key() -> tuple[str, str]:
    """A fresh ``(key_id, key)``."""
    key_id = secrets.token_hex(6)
    return key_id, f"ct_{key_id}_{secrets.token_urlsafe(32)}"


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def key_id_of(key: str) -> str | None:
    """The key id of something shaped like a key, else ``None``."""
    match = _KEY.match(key)
    return match.group(1) if match else None


def hash_matches(key: str, stored_hash: str) -> bool:
    return hmac.compare_digest(key_hash(key), stored_hash)


def parse_scopes(text: str) -> tuple[str, ...]:
    scopes = tuple(dict.fromkeys(s.strip() for s in text.split(",") if s.strip()))
    unknown = [s for s in scopes if s not in SCOPES]
    if unknown or not scopes:
        raise AuthError(f"unknown scopes {unknown}; the scopes are: {', '.join(SCOPES)}"
                        if unknown else "at least one scope is needed")
    return scopes


def check_key_scopes(scopes: tuple[str, ...], person: str | None) -> None:
    """The four-eyes rules for a new key: ``cases:review`` only for a person, and never
    with ``cases:start`` (nor ``admin``, which holds it)."""
    if person is not None and not PERSON_PATTERN.match(person):
        raise AuthError(f"person {person!r} must match {PERSON_PATTERN.pattern} (an id, "
                        "not an email: it is recorded in trails that cannot be erased)")
    if REVIEW_SCOPE not in scopes:
        return
    if person is None:
        raise AuthError(f"{REVIEW_SCOPE} is for a person: make the key with --person ID")
    if Scope.START in scopes or Scope.ADMIN in scopes:
        raise AuthError(f"a key with {REVIEW_SCOPE} cannot also start cases (cases:start or "
                        "admin): whoever reviews is never whoever started")


def check_tenant(tenant: str) -> str:
    if not TENANT_PATTERN.match(tenant):
        raise AuthError(f"tenant {tenant!r} must match {TENANT_PATTERN.pattern}")
    return tenant


@dataclass(frozen=True)
class Principal:
    """Who a request acts as: a tenant, the scopes granted, and the credential's id."""

    tenant: str
    scopes: frozenset[str]
    subject: str
    """``key:<keyId>`` for an API key; recorded as who started or cancelled a case."""
    person: str | None = None
    """The person behind the credential: an OIDC ``sub``, or the person a key was made
    for (``keys create --person``); ``None`` for a key made for a service."""
    key_name: str | None = None

    def allows(self, scope: Scope) -> bool:
        if scope == Scope.REVIEW:  # never implied: a person, given it by name
            return scope in self.scopes and self.person is not None
        return scope in self.scopes or Scope.ADMIN in self.scopes

    def reviewer(self) -> dict[str, str]:
        """The person as ``CASE_REVIEWED`` records them (``reviewer``)."""
        assert self.person is not None
        if self.subject.startswith("key:"):
            return {"subject": self.person, "via": "key", "keyId": self.subject[4:],
                    **({} if self.key_name is None else {"name": self.key_name})}
        return {"subject": self.person, "via": "oidc"}

    def sees(self, tenant: str) -> bool:
        """Whether a case of ``tenant`` is this principal's to see (the operator at the
        command line sees every tenant's)."""
        return self.tenant in (tenant, EVERY_TENANT)


EVERY_TENANT = "*"
"""The operator's tenant at the command line: no tenant may be named so (TENANT_PATTERN)."""


def operator(tenant: str = EVERY_TENANT) -> Principal:
    """The operator at the command line, with the API's identity and every scope; acts in
    ``tenant`` (a case it starts belongs to it), or across every tenant."""
    return Principal(tenant, frozenset({Scope.ADMIN.value}), "operator")


@dataclass(frozen=True)
class ApiKeyRecord:
    key_id: str
    key_hash: str
    tenant: str
    scopes: tuple[str, ...]
    name: str | None
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    person: str | None = None

    def principal(self, key: str, now: datetime) -> Principal | None:
        """The principal ``key`` acts as, or ``None`` if it is not this record's, or is
        revoked or expired."""
        if not hash_matches(key, self.key_hash) or self.revoked_at is not None:
            return None
        if self.expires_at is not None and self.expires_at <= now:
            return None
        return Principal(self.tenant, frozenset(self.scopes), f"key:{self.key_id}",
                         self.person, self.name)
