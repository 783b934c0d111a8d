"""Revocations and retirements that a restore cannot undo (docs/operations.md, "Backup
and restore").

Revoking an API key or retiring a signing key changes a row in the namespace's
database, so restoring a backup older than the change brings the key back to life. Each
one is therefore also written, before it is made, to a journal outside the database
(``CASETRAIL_REVOCATIONS_FILE``, default beside the secrets file:
``<ns>.revocations.jsonl``), one JSON object a line, appended and synced. ``casetrail
setup`` re-applies the journal, so the restore runbook's second ``setup`` (after
``pg_restore``) revokes and retires again whatever the backup predates. A key the
restored database does not hold (made after the backup) is left alone: it went with it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Literal

import orjson

from casetrail.adapters.store import ApiKeyStore, KeyRegistry, create_pool
from casetrail.adapters.store.keys import still_valid
from casetrail.adapters.store.pool import Pool
from casetrail.config import Settings

Kind = Literal["api_key", "signing_key", "action_key"]


@dataclass(frozen=True)
class Revocation:
    kind: Kind
    key_id: str
    at: datetime
    """When it was made; for a retired key, also its end of validity."""


def journal(settings: Settings) -> Path:
    if settings.revocations_file:
        return Path(settings.revocations_file)
    return settings.secrets_path().with_name(f"{settings.namespace}.revocations.jsonl")


def record(settings: Settings, revocation: Revocation) -> None:
    """Append ``revocation`` to the journal, synced, before the database is changed."""
    path = journal(settings)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    line = orjson.dumps({"kind": revocation.kind, "keyId": revocation.key_id,
                         "at": revocation.at.isoformat()}) + b"\n"
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(descriptor, line)
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def recorded(settings: Settings) -> list[Revocation]:
    try:
        lines = journal(settings).read_bytes().splitlines()
    except FileNotFoundError:
        return []
    kept = []
    for line in lines:
        if line.strip():
            entry = orjson.loads(line)
            kept.append(Revocation(entry["kind"], entry["keyId"],
                                   datetime.fromisoformat(entry["at"])))
    return kept


async def reapply(settings: Settings) -> list[Revocation]:
    """Make every recorded revocation and retirement again where the database has the key
    but not the change (a restored backup); those it made."""
    pending = recorded(settings)
    if not pending:
        return []
    pool = await create_pool(settings.database_url, max_size=1)
    made = []
    try:
        for one in pending:
            if await still_valid(pool, one.kind, one.key_id):
                await _apply(pool, one)
                made.append(one)
    finally:
        await pool.close()
    return made


async def _apply(pool: Pool, one: Revocation) -> None:
    if one.kind == "api_key":
        await ApiKeyStore(pool).revoke(one.key_id)
    else:
        registry = KeyRegistry(pool)
        if one.kind == "action_key":
            registry = registry.sibling("action_keys")
        await registry.retire(one.key_id, one.at)
