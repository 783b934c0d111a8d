"""The signing keys that verify events, and the capabilities' sealing keys."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import asyncpg

from casetrail.adapters.store.pool import Pool, translate_errors, utc_text
from casetrail.contract.integrity import public_key_text
from casetrail.errors import PermanentError
from casetrail.trail.verification import PublicKey


class CapabilityKeyRegistry:
    """Each capability's X25519 public key (``capability_keys``), which tool requests seal
    their sensitive values to (service/privacy/sealing.py). Registered by ``setup`` on the
    bootstrap connection; the worker reads them."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def register(self, capability: str, public_key: bytes) -> None:
        """Record (or replace: a rotation) ``capability``'s key."""
        async with translate_errors():
            await self._pool.execute(
                """INSERT INTO capability_keys (capability, public_key) VALUES ($1, $2)
                   ON CONFLICT (capability) DO UPDATE SET public_key = EXCLUDED.public_key,
                       registered_at = now()
                   WHERE capability_keys.public_key <> EXCLUDED.public_key""",
                capability, public_key)

    async def all(self) -> dict[str, bytes]:
        async with translate_errors():
            rows = await self._pool.fetch("SELECT capability, public_key FROM capability_keys")
        return {r["capability"]: bytes(r["public_key"]) for r in rows}


KeyTable = Literal["signing_keys", "action_keys", "audit_keys"]


class KeyRegistry:
    """The public keys events are signed with (``signing_keys``), or, as
    ``KeyRegistry(pool, "action_keys")``, those persons' actions are signed with (the
    API's action keys); both registered by an operator alone."""

    def __init__(self, pool: asyncpg.Pool, table: KeyTable = "signing_keys") -> None:
        self._pool = pool
        self._table = table

    def sibling(self, table: KeyTable) -> KeyRegistry:
        """The registry of ``table`` on the same pool."""
        return KeyRegistry(self._pool, table)

    async def register(self, key_id: str, public_key: bytes) -> PublicKey:
        """Record a worker's key (idempotent); the key as registered, retired or not.

        An operator's step (``casetrail signer register``, run by ``setup``), on the
        owner's or the bootstrap connection: no component's role may write
        ``signing_keys``, or whoever holds its password could vouch for a key of their
        own (docs/security.md)."""
        async with translate_errors():
            await self._pool.execute(
                f"""INSERT INTO {self._table} (key_id, public_key) VALUES ($1, $2)
                   ON CONFLICT (key_id) DO NOTHING""", key_id, public_key)
        registered = await self.registered(key_id, public_key)
        assert registered is not None
        return registered

    async def registered(self, key_id: str, public_key: bytes) -> PublicKey | None:
        """The key as registered (retired or not), ``None`` when it is not; a key id
        registered with another public key is a ``PermanentError``."""
        async with translate_errors():
            row = await self._pool.fetchrow(
                f"SELECT key_id, public_key, not_valid_after FROM {self._table} WHERE key_id = $1",
                key_id)
        if row is None:
            return None
        if bytes(row["public_key"]) != public_key:
            raise PermanentError(f"key id {key_id} is registered with another public key")
        return PublicKey(row["key_id"], bytes(row["public_key"]), row["not_valid_after"])

    async def all(self) -> list[PublicKey]:
        async with translate_errors():
            rows = await self._pool.fetch(
                f"SELECT key_id, public_key, not_valid_after FROM {self._table} "
                "ORDER BY created_at")
        return [PublicKey(r["key_id"], bytes(r["public_key"]), r["not_valid_after"])
                for r in rows]

    async def with_action_keys(self) -> tuple[list[PublicKey], list[PublicKey]]:
        """``(signing keys, action keys)``, read in one statement (what verifying a
        trail needs)."""
        async with translate_errors():
            rows = await self._pool.fetch(
                """SELECT 'signing' AS kind, key_id, public_key, not_valid_after, created_at
                   FROM signing_keys
                   UNION ALL
                   SELECT 'action', key_id, public_key, not_valid_after, created_at
                   FROM action_keys ORDER BY created_at""")
        found: dict[str, list[PublicKey]] = {"signing": [], "action": []}
        for r in rows:
            found[r["kind"]].append(PublicKey(r["key_id"], bytes(r["public_key"]),
                                              r["not_valid_after"]))
        return found["signing"], found["action"]

    async def describe(self) -> list[dict[str, Any]]:
        """Every key as ``GET /signing-keys`` shows it."""
        async with translate_errors():
            rows = await self._pool.fetch(
                f"""SELECT key_id, public_key, created_at, retired_at, not_valid_after
                    FROM {self._table} ORDER BY created_at""")
        return [{"keyId": r["key_id"], "publicKey": public_key_text(bytes(r["public_key"])),
                 "createdAt": utc_text(r["created_at"]), "retiredAt": utc_text(r["retired_at"]),
                 "notValidAfter": utc_text(r["not_valid_after"])} for r in rows]

    async def retire(self, key_id: str, not_valid_after: datetime | None = None
                     ) -> Literal["retired", "unknown"]:
        """From ``not_valid_after`` (default now) on, nothing this key signed verifies."""
        async with translate_errors():
            row = await self._pool.fetchrow(
                f"""UPDATE {self._table} SET retired_at = coalesce(retired_at, now()),
                          not_valid_after = coalesce($2, now())
                   WHERE key_id = $1 RETURNING key_id""", key_id, not_valid_after)
        return "retired" if row is not None else "unknown"


@dataclass(frozen=True)
class KeysInUse:
    """What a namespace's data depends on: keys registered in each key table, and
    cases' personal data sealed under each master key id."""

    registered: dict[str, int]
    sealed: dict[str, int]


async def keys_in_use(url: str, tables: Sequence[str]) -> KeysInUse | None:
    """What the database at ``url`` holds under keys; ``None`` when there is no database
    yet (nothing depends on any key). A table from a later schema counts as empty."""
    try:
        conn = await asyncpg.connect(url)
    except asyncpg.InvalidCatalogNameError:
        return None

    async def fetch(sql: str) -> list[asyncpg.Record]:
        try:
            return await conn.fetch(sql)
        except asyncpg.UndefinedTableError:
            return []

    try:
        registered = {}
        for table in tables:
            counted = await fetch(f"SELECT count(*) AS n FROM {table}")
            registered[table] = counted[0]["n"] if counted else 0
        sealed = await fetch("SELECT master_key_id, count(*) AS n FROM case_secrets "
                             "WHERE erased_at IS NULL GROUP BY master_key_id")
    finally:
        await conn.close()
    return KeysInUse(registered, {r["master_key_id"]: r["n"] for r in sealed})


_REVOKED_IN = {"api_key": ("api_keys", "revoked_at"),
               "signing_key": ("signing_keys", "not_valid_after"),
               "action_key": ("action_keys", "not_valid_after")}


async def still_valid(pool: Pool, kind: Literal["api_key", "signing_key", "action_key"],
                      key_id: str) -> bool:
    """Whether the key is registered and neither revoked nor retired (a restored backup
    may hold a key as it was before its revocation)."""
    table, ended = _REVOKED_IN[kind]
    return bool(await pool.fetchval(
        f"SELECT EXISTS (SELECT 1 FROM {table} WHERE key_id = $1 AND {ended} IS NULL)",
        key_id))
