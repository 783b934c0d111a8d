"""Every route states who may call it: a dependency that yields the caller.

``requires(scope, ...)`` is the dependency of an authenticated route: no or an
unreadable ``Authorization: Bearer`` → 401 with ``WWW-Authenticate: Bearer``; a key
that is unknown, revoked or expired → 401; a key without the scope → 403 naming it.
``anyone()`` marks the public routes. tests/integration/test_api_auth.py walks the app's
routes and fails on one with neither.

Keys are checked against Postgres through a cache with a one-second life, so a
revoked key stops working on every API process within a second, and a request costs a
dictionary lookup and one SHA-256 most of the time.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from fastapi import HTTPException, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from casetrail.adapters.store import ApiKeyStore
from casetrail.api.oidc import OidcVerifier
from casetrail.contract.auth import ApiKeyRecord, AuthError, Principal, Scope, key_id_of

CACHE_SECONDS = 1.0
"""How long a key's record is trusted without asking Postgres again (revocation delay)."""

ANONYMOUS = Principal(tenant="", scopes=frozenset(), subject="anonymous")

bearer = HTTPBearer(auto_error=False, scheme_name="apiKey",
                    description="An API key from `casetrail keys create` (`ct_…`), or an "
                                "OIDC access token when the operator configured an issuer.")

CallerDependency = Callable[..., Awaitable[Principal]]


def _unauthorized(detail: str) -> HTTPException:
    return HTTPException(401, detail, headers={"WWW-Authenticate": "Bearer"})


@dataclass
class Caller:
    """The API's authenticator: API keys, cached briefly."""

    keys: ApiKeyStore | None = None
    oidc: OidcVerifier | None = None
    _cache: dict[str, tuple[float, ApiKeyRecord | None]] = field(default_factory=dict)

    async def principal(self, token: str) -> Principal | None:
        key_id = key_id_of(token)
        if key_id is None:
            return None if self.oidc is None else await self.oidc.principal(token)
        if self.keys is None:
            return None
        now = time.monotonic()
        cached = self._cache.get(key_id)
        if cached is None or now - cached[0] > CACHE_SECONDS:
            if len(self._cache) > 10_000:  # keys guessed at random must not grow it forever
                self._cache.clear()
            cached = (now, await self.keys.find(key_id))
            self._cache[key_id] = cached
        record = cached[1]
        return None if record is None else record.principal(token, datetime.now(UTC))

def requires(*scopes: Scope) -> CallerDependency:
    """The dependency of a route that needs a valid key holding ``scopes`` (checked by
    the app's ``Caller``, ``app.state.caller``)."""

    async def authenticated(
        request: Request, credentials: HTTPAuthorizationCredentials | None = Security(bearer),
    ) -> Principal:
        caller: Caller = request.app.state.caller
        if credentials is None:
            raise _unauthorized("an Authorization: Bearer API key is required")
        try:
            principal = await caller.principal(credentials.credentials)
        except AuthError as exc:
            raise _unauthorized(str(exc)) from None
        if principal is None:
            raise _unauthorized("the API key is unknown, revoked or expired")
        for scope in scopes:
            if not principal.allows(scope):
                raise HTTPException(403, f"this API key lacks the scope {scope.value!r}")
        return principal

    authenticated.casetrail_caller = scopes or ("authenticated",)  # type: ignore[attr-defined]
    return authenticated


def anyone() -> CallerDependency:
    """The dependency of a public route (docs/design.md, "Trust": public routes)."""

    async def public() -> Principal:
        return ANONYMOUS

    public.casetrail_caller = ("public",)  # type: ignore[attr-defined]
    return public
