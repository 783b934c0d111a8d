"""Migrations: create the database, apply once, safe when two run at once, refuse edits."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import asyncpg
import pytest

from casetrail.adapters.store.migrate import MIGRATIONS_DIR, drop_database, migrate
from casetrail.errors import PermanentError
from tests.conftest import BASE_DB
from tests.support.records import seeded_events


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
            await conn.execute(seeded_events(
                "VALUES (gen_random_uuid(), gen_random_uuid(), 1, 0, 'CASE_STARTED', now(), "
                "'{}'::jsonb, 'default', repeat('0', 64), 'abcdefabcdefabcd', "
                "repeat('s', 86))"))
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


async def test_the_log_of_an_older_schema_becomes_the_default_partition(tmp_path: Path) -> None:
    """An upgrade keeps every event where it was and readable the same ways: the old log
    becomes event_log's default partition; its views, grants and row policies move to
    the partitioned table; a new case lands in its month's partition."""
    url = BASE_DB.rsplit("/", 1)[0] + f"/casetrail_migrate_{uuid.uuid4().hex[:8]}"
    older = tmp_path / "migrations"
    older.mkdir()
    for path in MIGRATIONS_DIR.glob("*.sql"):
        if int(path.name[:3]) < 31:
            (older / path.name).write_text(path.read_text())
    reader = f"casetrail_migrate_reader_{uuid.uuid4().hex[:8]}"
    try:
        await migrate(url, older)
        conn = await asyncpg.connect(url)
        try:
            await conn.execute(f"CREATE ROLE {reader}")
            await conn.execute(f"GRANT SELECT ON event_log, react_cycles TO {reader}")
            case_id = uuid.uuid4()
            await conn.execute(
                "INSERT INTO event_log (event_id, case_id, attempt, seq, event_type, "
                "occurred_at, schema_version, payload) VALUES (gen_random_uuid(), $1, 1, 0, "
                "'REACT_CYCLE', now(), 1, '{\"cycleIndex\": 1, \"reasoningText\": \"r\"}')",
                case_id)
            await migrate(url)
            where = await conn.fetchval("SELECT tableoid::regclass::text FROM event_log "
                                        "WHERE case_id = $1", case_id)
            assert where == "event_log_default"
            assert await conn.fetchval("SELECT reasoning_text FROM react_cycles "
                                       "WHERE case_id = $1", case_id) == "r"
            assert await conn.fetchval(
                "SELECT pg_get_viewdef('react_cycles'::regclass) ~ 'event_log_default'") is False
            assert await conn.fetchval(
                "SELECT has_table_privilege($1, 'event_log', 'SELECT') AND NOT "
                "has_table_privilege($1, 'event_log_default', 'SELECT')", reader) is True
            assert await conn.fetchval(
                "SELECT count(*) FROM pg_policies WHERE tablename = 'event_log'") == 1
            with pytest.raises(asyncpg.RaiseError, match="append-only"):
                await conn.execute("DELETE FROM event_log WHERE case_id = $1", case_id)
        finally:
            await conn.execute(f"DROP OWNED BY {reader}")
            await conn.execute(f"DROP ROLE {reader}")
            await conn.close()
    finally:
        await drop_database(url)
