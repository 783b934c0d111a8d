"""Migrations: create the database, apply once, safe when two run at once, refuse edits."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import asyncpg
import pytest

from casetrail.errors import PermanentError
from casetrail.ops.migrate import MIGRATIONS_DIR, drop_database, migrate
from tests.conftest import BASE_DB


async def test_concurrent_migrators_apply_each_file_once(tmp_path: Path) -> None:
    url = BASE_DB.rsplit("/", 1)[0] + f"/casetrail_migrate_{uuid.uuid4().hex[:8]}"
    try:
        results = await asyncio.gather(migrate(url), migrate(url), migrate(url))
        applied = sorted(name for result in results for name in result)
        assert applied == sorted(p.name for p in MIGRATIONS_DIR.glob("*.sql"))
        assert await migrate(url) == []  # the second time is a no-op
        conn = await asyncpg.connect(url)
        try:
            rows = await conn.fetchval("SELECT count(*) FROM schema_migrations")
            assert rows == len(applied)
            await conn.execute(
                "INSERT INTO event_log VALUES (gen_random_uuid(), gen_random_uuid(), 1, 0, "
                "'CASE_STARTED', now(), now(), 1, '{}')")
            for statement in ("DELETE FROM event_log", "UPDATE event_log SET seq = 5",
                              "TRUNCATE event_log"):
                with pytest.raises(asyncpg.RaiseError, match="append-only"):
                    await conn.execute(statement)
        finally:
            await conn.close()

        edited = tmp_path / "migrations"
        edited.mkdir()
        for path in MIGRATIONS_DIR.glob("*.sql"):
            (edited / path.name).write_text(path.read_text() + "\n-- edited\n")
        with pytest.raises(PermanentError, match="changed after it was applied"):
            await migrate(url, edited)
    finally:
        await drop_database(url)
