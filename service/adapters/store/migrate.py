"""Applies the numbered SQL files in ``migrations/``.

Creates the database when it is absent, records each applied file (with its
checksum) in ``schema_migrations``, holds a Postgres advisory lock so two
processes migrating at once apply each file once, and does nothing when
everything has run. Each file runs in its own transaction.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from casetrail.errors import PermanentError, StoreUnavailable

log = logging.getLogger("casetrail.migrate")

# From a checkout the SQL files sit beside the packages; an installed image points
# CASETRAIL_MIGRATIONS_DIR at its copy.
MIGRATIONS_DIR = Path(
    os.environ.get("CASETRAIL_MIGRATIONS_DIR")
    or Path(__file__).resolve().parents[3] / "migrations"
)
_LOCK_KEY = 0x6361736574726C  # "casetrl": one advisory lock for every migrator
_FILE_NAME = re.compile(r"^(\d{3,})_[a-z0-9_]+\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def discover(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    found = []
    for path in sorted(directory.glob("*.sql")):
        match = _FILE_NAME.match(path.name)
        if not match:
            raise PermanentError(f"migration file name {path.name!r} is not NNN_name.sql")
        found.append(Migration(int(match.group(1)), path.name, path.read_text()))
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise PermanentError("two migration files share a number")
    return found


def quote_ident(name: str) -> str:
    """``name`` as a Postgres identifier (role and database names carry the namespace,
    which may hold ``-`` and ``.``)."""
    return '"' + name.replace('"', '""') + '"'


def with_database(url: str, database: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{database}"))


def database_name(url: str) -> str:
    return urlsplit(url).path.lstrip("/") or "postgres"


async def ensure_database(url: str) -> None:
    """Create the database named in ``url`` when it does not exist yet."""
    name = database_name(url)
    admin = await asyncpg.connect(with_database(url, "postgres"))
    try:
        exists = await admin.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name)
        if not exists:
            try:
                await admin.execute(f"CREATE DATABASE {quote_ident(name)}")
                log.info("created database %s", name)
            except (asyncpg.DuplicateDatabaseError, asyncpg.UniqueViolationError):
                # Another migrator created it first (racing CREATE DATABASEs surface
                # as a unique violation on pg_database).
                pass
    finally:
        await admin.close()


async def drop_database(url: str) -> None:
    """Drop the database named in ``url`` if it exists, closing its connections
    (for the private databases of tests and benchmarks)."""
    admin = await asyncpg.connect(with_database(url, "postgres"))
    try:
        await admin.execute(f"DROP DATABASE IF EXISTS {quote_ident(database_name(url))} "
                            "WITH (FORCE)")
    finally:
        await admin.close()


async def migrate(url: str, directory: Path = MIGRATIONS_DIR, *, owner: str | None = None
                  ) -> list[str]:
    """Bring the schema up to date; returns the names of the files applied now.

    With ``owner`` (the namespace's owner role, see ``casetrail setup``) the files run
    as that role, so it owns what they create and no component does."""
    try:
        await ensure_database(url)
        conn = await asyncpg.connect(url)
    except (OSError, asyncpg.PostgresConnectionError) as exc:
        raise StoreUnavailable(f"cannot reach Postgres to migrate: {exc}") from exc
    applied: list[str] = []
    try:
        await conn.execute("SELECT pg_advisory_lock($1)", _LOCK_KEY)
        if owner is not None:
            await conn.execute(f"SET ROLE {quote_ident(owner)}")
        await conn.execute(
            """CREATE TABLE IF NOT EXISTS schema_migrations (
                   version integer PRIMARY KEY,
                   name text NOT NULL,
                   checksum text NOT NULL,
                   applied_at timestamptz NOT NULL DEFAULT now())"""
        )
        done = {
            row["version"]: row["checksum"]
            for row in await conn.fetch("SELECT version, checksum FROM schema_migrations")
        }
        for migration in discover(directory):
            if migration.version in done:
                if done[migration.version] != migration.checksum:
                    raise PermanentError(
                        f"{migration.name} changed after it was applied; add a new file instead"
                    )
                continue
            async with conn.transaction():
                await conn.execute(migration.sql)
                await conn.execute(
                    "INSERT INTO schema_migrations (version, name, checksum) VALUES ($1, $2, $3)",
                    migration.version,
                    migration.name,
                    migration.checksum,
                )
            applied.append(migration.name)
            log.info("applied %s", migration.name)
    finally:
        await conn.execute("RESET ROLE")
        await conn.execute("SELECT pg_advisory_unlock($1)", _LOCK_KEY)
        await conn.close()
    return applied
