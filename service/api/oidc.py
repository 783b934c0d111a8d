"""OIDC bearer tokens: JWTs from an operator's identity provider, checked against its
JWKS (PyJWT). Issuer, audience and expiry are required; only asymmetric algorithms
are accepted, so ``alg: none`` and an HS256 token "signed" with the public key are
refused. The tenant and the scopes come from configurable claims."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import jwt

from service.auth import SCOPES, TENANT_PATTERN, Principal
from service.config import Settings

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
        """The principal of a valid token, else ``None`` (any reason: 401)."""
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
        return Principal(tenant, frozenset(s for s in names if s in SCOPES),
                         f"oidc:{claims['sub']}", str(claims["sub"]))
