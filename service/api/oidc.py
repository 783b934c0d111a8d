"""OIDC bearer tokens: JWTs from an operator's identity provider, checked against its
JWKS (PyJWT). Issuer, audience and expiry are required; only asymmetric algorithms
are accepted, so ``alg: none`` and an HS256 token "signed" with the public key are
refused. The tenant and the scopes come from configurable claims."""

from __future__ import annotations

import asyncio
import unicodedata
from dataclasses import dataclass, field
from typing import Any

import jwt

from casetrail.config import Settings
from casetrail.contract.auth import (
    REVIEW_SCOPE,
    SCOPES,
    TENANT_PATTERN,
    AuthError,
    Principal,
    Scope,
)

MAX_SUBJECT = 200
"""The longest ``sub`` kept (a reviewer's subject in the trail holds at most this)."""

ALGORITHMS = ("RS256", "RS384", "RS512", "ES256", "ES384", "PS256", "EdDSA")
"""Asymmetric only: a symmetric algorithm would let the public key sign."""


@dataclass
class OidcVerifier:
    """Checks a JWT against the configured issuer (one JWKS client, its keys cached)."""

    issuer: str
    audience: str
    jwks_url: str
    tenant_claim: str = "tenant"
    scopes_claim: str = "scope"
    _jwks: jwt.PyJWKClient = field(init=False)

    def __post_init__(self) -> None:
        self._jwks = jwt.PyJWKClient(self.jwks_url, cache_keys=True, lifespan=300,
                                     timeout=5)

    @classmethod
    def from_settings(cls, settings: Settings) -> OidcVerifier | None:
        if not (settings.oidc_issuer and settings.oidc_audience and settings.oidc_jwks_url):
            return None
        return cls(settings.oidc_issuer, settings.oidc_audience, settings.oidc_jwks_url,
                   settings.oidc_tenant_claim, settings.oidc_scopes_claim)

    async def principal(self, token: str) -> Principal | None:
        """The principal of a valid token, else ``None`` (any reason: 401); ``AuthError``
        naming the reason for a valid token that breaks casetrail's rules (401 too)."""
        try:
            # The JWKS client fetches with urllib: off the event loop.
            signing_key = await asyncio.to_thread(self._jwks.get_signing_key_from_jwt, token)
            claims: dict[str, Any] = jwt.decode(
                token, signing_key.key, algorithms=list(ALGORITHMS), audience=self.audience,
                issuer=self.issuer, options={"require": ["exp", "iss", "aud", "sub"]})
        except (jwt.PyJWTError, ValueError):
            return None
        tenant = claims.get(self.tenant_claim)
        if not isinstance(tenant, str) or not TENANT_PATTERN.match(tenant):
            return None
        granted = claims.get(self.scopes_claim, "")
        names = granted.split() if isinstance(granted, str) else \
            [s for s in granted if isinstance(s, str)] if isinstance(granted, list) else []
        scopes = frozenset(s for s in names if s in SCOPES)
        if REVIEW_SCOPE in scopes and scopes & {Scope.START, Scope.ADMIN}:
            raise AuthError(f"a token may not hold {REVIEW_SCOPE} beside cases:start or admin "
                            "(four eyes): the identity provider must issue them apart")
        subject = person_subject(claims["sub"])
        return Principal(tenant, scopes, f"oidc:{subject}", subject)


def person_subject(sub: Any) -> str:
    """An OIDC ``sub`` as the identity provider wrote it (``auth0|…``, an e-mail, a
    UUID), stored as given; ``AuthError`` for one that is not text, is empty or over
    long, or holds a control character (a NUL included)."""
    if not isinstance(sub, str) or not 1 <= len(sub) <= MAX_SUBJECT:
        raise AuthError(f"the token's sub must be text of 1 to {MAX_SUBJECT} characters")
    if any(unicodedata.category(c) in ("Cc", "Cs") for c in sub):
        raise AuthError("the token's sub holds a control character")
    return sub
