"""A case's sealed sensitive values, and their erasure."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

import asyncpg

from casetrail.adapters.store.pool import translate_errors
from casetrail.errors import PermanentError
from casetrail.privacy.sensitive import SealedValues, Vault


@dataclass(frozen=True)
class SecretState:
    """What ``case_secrets`` says of a case: its sealed values, or who erased them."""

    placeholders: tuple[str, ...]
    sealed: SealedValues | None
    erased_at: datetime | None
    erased_by: str | None


class CaseSecrets:
    """A case's sensitive values: sealed on the way in, opened for ``pii:read`` callers
    (the worker gets them sealed with its claim), shredded on erase; every read in
    clear, export and erasure logged."""

    def __init__(self, pool: asyncpg.Pool, vault: Vault) -> None:
        self._pool = pool
        self.vault = vault

    async def check_master_key(self) -> None:
        """Refuse (``PermanentError``) a master key that none of the stored personal data
        is sealed under: started with it, a component would answer with placeholders for
        good and seal new values under a key the rest of the data does not share."""
        async with translate_errors():
            row = await self._pool.fetchrow(
                "SELECT EXISTS (SELECT 1 FROM case_secrets WHERE erased_at IS NULL) AS any, "
                "EXISTS (SELECT 1 FROM case_secrets WHERE erased_at IS NULL AND "
                "master_key_id = $1) AS ours", self.vault.key_id)
        if row is not None and row["any"] and not row["ours"]:
            raise PermanentError(
                f"the master key given (key id {self.vault.key_id}) is not the one any stored "
                "personal data is sealed under: restore the namespace's master key "
                "(CASETRAIL_MASTER_KEY or the secrets file; docs/operations.md, \"Backup and "
                "restore\")")

    async def state(self, case_id: uuid.UUID) -> SecretState | None:
        async with translate_errors():
            row = await self._pool.fetchrow(
                """SELECT master_key_id, wrapped_key, ciphertext, placeholders, erased_at,
                          erased_by FROM case_secrets WHERE case_id = $1""", case_id)
        if row is None:
            return None
        sealed = None if row["wrapped_key"] is None else SealedValues(
            row["master_key_id"], bytes(row["wrapped_key"]), bytes(row["ciphertext"]))
        return SecretState(tuple(row["placeholders"]), sealed, row["erased_at"],
                           row["erased_by"])

    async def held(self, case_id: uuid.UUID, tenant: str) -> bool:
        """Whether a legal hold keeps the case (its values are not erased meanwhile)."""
        async with translate_errors():
            return bool(await self._pool.fetchval("SELECT case_held($1, $2)", case_id,
                                                  tenant))

    async def log_access(self, principal: str, tenant: str, case_id: uuid.UUID,
                         action: Literal["pii:read", "export", "erase"]) -> None:
        async with translate_errors():
            await self._pool.execute(
                "INSERT INTO access_log (principal, tenant_id, case_id, action) "
                "VALUES ($1, $2, $3, $4)", principal, tenant, case_id, action)
