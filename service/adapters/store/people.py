"""API keys and the names of the persons behind them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

import asyncpg

from casetrail.adapters.store.pool import translate_errors
from casetrail.contract.auth import ApiKeyRecord, key_hash, new_key


async def principal_names(pool: asyncpg.Pool, subjects: Iterable[str | None]
                          ) -> dict[str, str]:
    """How people are shown a recorded principal (``startedBy``): a key made for a
    person as the person and the key's name (``rita (Rita's laptop)``), another key as
    its name, an OIDC subject as itself. Unknown or nameless keys are left out."""
    keys = {s[4:] for s in subjects if s and s.startswith("key:")}
    names = {s: s[5:] for s in subjects if s and s.startswith("oidc:")}
    if keys:
        async with translate_errors():
            rows = await pool.fetch("SELECT key_id, name, person FROM api_keys "
                                    "WHERE key_id = ANY($1::text[])", list(keys))
        for row in rows:
            shown = row["person"] or row["name"]
            if row["person"] and row["name"]:
                shown = f"{row['person']} ({row['name']})"
            if shown:
                names[f"key:{row['key_id']}"] = shown
    return names




class ApiKeyStore:
    """API keys (``api_keys``): created, listed, revoked, and found by id."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def create(self, tenant: str, scopes: Sequence[str], name: str | None = None,
                     expires_at: datetime | None = None, person: str | None = None
                     ) -> tuple[str, str]:
        """A new key for ``tenant`` (for ``person``, when one holds it); returns
        ``(key_id, key)``. The key is not kept."""
        key_id, key = new_key()
        async with translate_errors():
            await self._pool.execute(
                """INSERT INTO api_keys (key_id, key_hash, tenant_id, scopes, name, expires_at,
                                         person)
                   VALUES ($1, $2, $3, $4, $5, $6, $7)""",
                key_id, key_hash(key), tenant, [str(s) for s in scopes], name, expires_at, person)
        return key_id, key

    async def find(self, key_id: str) -> ApiKeyRecord | None:
        async with translate_errors():
            row = await self._pool.fetchrow(
                "SELECT * FROM api_keys WHERE key_id = $1", key_id)
        return None if row is None else _key_record(row)

    async def all(self) -> list[ApiKeyRecord]:
        async with translate_errors():
            rows = await self._pool.fetch("SELECT * FROM api_keys ORDER BY created_at")
        return [_key_record(r) for r in rows]

    async def revoke(self, key_id: str) -> bool:
        async with translate_errors():
            row = await self._pool.fetchrow(
                """UPDATE api_keys SET revoked_at = coalesce(revoked_at, now())
                   WHERE key_id = $1 RETURNING key_id""", key_id)
        return row is not None


def _key_record(row: asyncpg.Record) -> ApiKeyRecord:
    return ApiKeyRecord(row["key_id"], row["key_hash"], row["tenant_id"], tuple(row["scopes"]),
                        row["name"], row["created_at"], row["expires_at"], row["revoked_at"],
                        row["person"])


class PersonIdentities:
    """Identities linked to a person (``person_identities``): an operator's step, on the
    bootstrap connection (no component writes them)."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def link(self, identity: str, person: str) -> None:
        """``identity`` (``oidc:<sub>`` or ``key:<person id>``) belongs to ``person``."""
        async with translate_errors():
            await self._pool.execute(
                """INSERT INTO person_identities (identity, person) VALUES ($1, $2)
                   ON CONFLICT (identity) DO UPDATE SET person = EXCLUDED.person,
                       linked_at = now()""", identity, person)

    async def unlink(self, identity: str) -> bool:
        async with translate_errors():
            done = await self._pool.fetchval(
                "DELETE FROM person_identities WHERE identity = $1 RETURNING 1", identity)
        return done is not None

    async def all(self) -> list[tuple[str, str]]:
        async with translate_errors():
            rows = await self._pool.fetch(
                "SELECT identity, person FROM person_identities ORDER BY person, identity")
        return [(r["identity"], r["person"]) for r in rows]
