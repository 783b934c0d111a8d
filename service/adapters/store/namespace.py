"""A namespace's database as setup makes and removes it (docs/security.md): the owner
role and each component's login role, the database owned by the owner, the migrations
run as the owner, every component's grants (and nothing more), and the refusal to touch
a database that holds another namespace's objects. ``casetrail setup`` (ops/setup.py)
decides the identities and passwords; this module is where they meet Postgres."""

from __future__ import annotations

from collections.abc import Mapping

import asyncpg

from casetrail.adapters.store.migrate import (
    database_name,
    drop_database,
    ensure_database,
    migrate,
    quote_ident,
    with_database,
)
from casetrail.config import DATABASE_COMPONENTS, Settings
from casetrail.errors import PermanentError


def grants(settings: Settings) -> list[str]:
    """What each component may do, and nothing more (run by the owner's authority)."""
    api, worker, consumer, ledger, auditor = (quote_ident(settings.database_role(c))
                                              for c in DATABASE_COMPONENTS)
    everyone = f"{api}, {worker}, {consumer}, {ledger}, {auditor}"
    policy = quote_ident(f"{settings.namespace}_components")
    statements = [
        f"REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {everyone}",
        f"REVOKE ALL ON ALL FUNCTIONS IN SCHEMA public FROM {everyone}",
        # The API starts, reads and cancels cases (a case nobody claimed yet can be
        # withdrawn when its start command could not be published); reads the log,
        # the signing keys and API keys. It never writes the log.
        f"GRANT SELECT, INSERT ON cases TO {api}",
        f"GRANT EXECUTE ON FUNCTION withdraw_case(uuid) TO {api}",
        # ... its business keys (values, or digests of sensitive ones, which erasing
        # deletes: the owner's trigger on the stored CASE_ERASED, migration 034).
        f"GRANT SELECT, INSERT ON case_keys TO {api}",
        f"GRANT UPDATE (cancel_requested_at, cancel_reason, cancelled_by, updated_at, "
        f"start_confirmed_at, start_publishing_until) ON cases TO {api}",
        f"GRANT SELECT ON event_log, signing_keys, api_keys, action_keys, person_identities "
        f"TO {api}",
        # ... keeps what a person did about a case waiting for one (a review, a cancel),
        # once per wait: the worker records it in the trail.
        f"GRANT SELECT, INSERT ON case_actions TO {api}",
        # ... seals a new case's sensitive values and opens them for pii:read callers
        # (it shreds nothing: the owner's trigger does, when the worker's CASE_ERASED is
        # stored); logs each such access (append-only).
        f"GRANT SELECT, INSERT ON case_secrets TO {api}",
        f"GRANT INSERT ON access_log TO {api}",
        # The worker claims and leases cases, reads whether one has ended and whether
        # its key is registered, and notes when its sweeper re-sent a stranded case's
        # start command. It emits events on the bus only, and never writes
        # signing_keys: keys are registered by an operator (`signer register`).
        f"GRANT SELECT ON cases, event_log, signing_keys, case_secrets, capability_keys, "
        f"case_actions, action_keys, person_identities, starts_before_signing TO {worker}",
        f"GRANT UPDATE (attempts_claimed, lease_owner, lease_expires_at, terminal_published, "
        f"start_resent_at, parked_attempt, parked_at, review_due_at, wait_kind, "
        f"wait_call_id, wait_excludes) ON cases TO {worker}",
        # ... and moves an action it refuses to act on (no action key signed it, or it
        # breaks the wait's rules) out of the wait's way, kept for the investigation,
        # only through the owner's function: it never deletes a person's action.
        f"GRANT EXECUTE ON FUNCTION refuse_case_action(uuid, integer, text, text) "
        f"TO {worker}",
        # ... and knows the person behind the key that started a case (four eyes),
        # never a key's hash or scopes.
        f"GRANT SELECT (key_id, person) ON api_keys TO {worker}",
        # The consumer appends to the log; no UPDATE, DELETE or TRUNCATE on the log (and
        # the triggers refuse them anyway), and nothing on cases: the owner's trigger
        # folds each inserted batch into the case rows (migration 033).
        f"GRANT SELECT, INSERT ON event_log TO {consumer}",
        f"GRANT SELECT ON signing_keys TO {consumer}",
        # (Each stored event enters ledger_queue through a trigger of the owner's.)
        # The ledger alone builds the transparency log: takes stored events from the
        # queue, appends leaves and tiles (tiles may only grow, leaves and checkpoints
        # are never changed: the triggers refuse it), signs checkpoints.
        f"GRANT SELECT, DELETE ON ledger_queue TO {ledger}",
        f"GRANT SELECT, INSERT ON ledger_leaves, ledger_checkpoints, ledger_keys, "
        f"ledger_acceptances TO {ledger}",
        f"GRANT SELECT ON ledger_cosignatures TO {ledger}",
        f"GRANT SELECT, INSERT, UPDATE ON ledger_tiles TO {ledger}",
        # The API serves the log (checkpoints, proofs) and keeps witnesses' checked
        # cosignatures; it reads which leaves a case has for its verdicts.
        f"GRANT SELECT ON ledger_leaves, ledger_tiles, ledger_checkpoints, ledger_keys, "
        f"ledger_cosignatures, ledger_acceptances TO {api}",
        f"GRANT INSERT ON ledger_cosignatures TO {api}",
        # Retention and holds (docs/design.md, "Keeping records as long as the law
        # says"): the API keeps policies, approvals, business dates, holds and their
        # releases (append-only, as people set them) and reads tombstones; the worker
        # appends CASE_EXPIRED and expires a case through the owner's function, which
        # checks the tombstone and the holds in the database. Nobody deletes events or
        # cases directly.
        f"GRANT SELECT, INSERT ON retention_policies, retention_approvals, "
        f"retention_business_dates, legal_holds, legal_hold_releases TO {api}",
        f"GRANT SELECT ON retention_in_force, retention_floor, case_tombstones, "
        f"case_key_marks TO {api}",
        f"GRANT EXECUTE ON FUNCTION case_held(uuid, text) TO {api}, {worker}",
        f"GRANT SELECT ON retention_in_force, retention_business_dates, case_tombstones, "
        f"case_keys, case_key_marks, legal_holds, legal_hold_releases, held_cases, "
        f"retention_approvals, retention_policies TO {worker}",
        f"GRANT EXECUTE ON FUNCTION expire_case(uuid), journal_missing(jsonb) TO {worker}",
        # ... keeps the log's monthly partitions made ahead, and drops a month whole once
        # every case in it expired: the owner's functions check that in the database (a
        # component is granted nothing on a partition itself).
        f"GRANT EXECUTE ON FUNCTION event_log_prepare_partitions(integer), "
        f"event_log_drop_expired_partitions() TO {worker}",
        # Backtests (docs/backtests.md): the API keeps what people ask for and reads
        # what came of it; a worker takes one at a time under a lease, keeps its results
        # and its signed record (append-only: the database chains the records and puts
        # each in the transparency log). Nothing here writes the log or the case tables.
        f"GRANT SELECT, INSERT ON backtests TO {api}",
        f"GRANT SELECT ON backtest_results, backtest_records TO {api}",
        f"GRANT SELECT, UPDATE (status, runner, lease_expires_at, started_at, cases_done, "
        f"cases_selected, problem, finished_at) ON backtests TO {worker}",
        f"GRANT SELECT, INSERT ON backtest_results, backtest_records TO {worker}",
        # ... and, under a policy that archives, exports the case's bundle first: its
        # log proofs come from the transparency log (public: /ledger serves it).
        f"GRANT SELECT ON ledger_leaves, ledger_tiles, ledger_checkpoints, ledger_keys, "
        f"ledger_cosignatures TO {worker}",
        # The auditor (`casetrail audit`) reads the log, the cases, the keys and the
        # transparency log, and appends its passes (append-only); it writes nothing
        # else, and reads of the sealed values only whether and when they were erased.
        f"GRANT SELECT ON event_log, cases, case_tombstones, signing_keys, action_keys, "
        f"ledger_leaves, ledger_tiles, ledger_checkpoints, ledger_keys, ledger_cosignatures, "
        f"ledger_queue, backtest_records, backtest_results TO {auditor}",
        f"GRANT SELECT (case_id, erased_at) ON case_secrets TO {auditor}",
        # ... and judges again each person's action a worker refused, as the worker did:
        # the refusal, the persons behind the identities (never a key's hash or scopes).
        f"GRANT SELECT ON case_actions_refused, person_identities TO {auditor}",
        f"GRANT SELECT (key_id, person) ON api_keys TO {auditor}",
        f"GRANT SELECT, INSERT ON audit_runs TO {auditor}",
        # ... signed under its own key, which an operator registers (never a component).
        f"GRANT SELECT ON audit_keys TO {auditor}",
    ]
    # Row-level security (migration 004) shows a SQL reader its tenant's rows; the
    # components serve every tenant and check tenancy themselves.
    for table in ("cases", "event_log"):
        statements += [f"DROP POLICY IF EXISTS {policy} ON {table}",
                       f"CREATE POLICY {policy} ON {table} TO {everyone} "
                       "USING (true) WITH CHECK (true)"]
    return statements


_TRANSFER_OWNERSHIP = """
SELECT format('ALTER %s %s OWNER TO %I',
              CASE c.relkind WHEN 'v' THEN 'VIEW' WHEN 'S' THEN 'SEQUENCE'
                             WHEN 'm' THEN 'MATERIALIZED VIEW' ELSE 'TABLE' END,
              c.oid::regclass, $1::text)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm', 'S')
  AND pg_get_userbyid(c.relowner) <> $1
UNION ALL
SELECT format('ALTER FUNCTION %s OWNER TO %I', p.oid::regprocedure, $1::text)
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = 'public' AND pg_get_userbyid(p.proowner) <> $1
"""


async def _ensure_role(admin: asyncpg.Connection, role: str, password: str | None) -> None:
    verb = "ALTER" if await admin.fetchval(
        "SELECT 1 FROM pg_roles WHERE rolname = $1", role) else "CREATE"
    login = "NOLOGIN" if password is None else "LOGIN"
    statement = (f"{verb} ROLE {quote_ident(role)} {login} NOSUPERUSER NOCREATEDB "
                 "NOCREATEROLE NOREPLICATION NOBYPASSRLS")
    if password is not None:  # a utility statement takes no parameters: quote it
        statement += " PASSWORD " + await admin.fetchval("SELECT quote_literal($1)", password)
    try:
        await admin.execute(statement)
    except asyncpg.DuplicateObjectError:  # another setup created it in between
        await admin.execute(statement.replace("CREATE", "ALTER", 1))


async def setup_database(settings: Settings, passwords: Mapping[str, str]) -> list[str]:
    """Roles, the database (owned by the owner role), migrations as the owner, grants;
    the names of the migration files applied now. ``passwords``: each component's
    database password."""
    owner = settings.database_role("owner")
    database = database_name(settings.database_url)
    # Everything that could refuse is checked before anything is created.
    await check_not_others(settings, "set up")
    admin = await asyncpg.connect(with_database(settings.database_url, "postgres"))
    try:
        await _ensure_role(admin, owner, None)
        for component in DATABASE_COMPONENTS:
            await _ensure_role(admin, settings.database_role(component),
                               passwords[component])
    finally:
        await admin.close()
    await ensure_database(settings.database_url)
    conn = await asyncpg.connect(settings.database_url)
    try:
        await _refuse_others(conn, settings, "set up")
        db = quote_ident(database)
        await conn.execute(f"ALTER DATABASE {db} OWNER TO {quote_ident(owner)}")
        await conn.execute(f"REVOKE ALL ON DATABASE {db} FROM PUBLIC")
        for component in DATABASE_COMPONENTS:
            await conn.execute(f"GRANT CONNECT ON DATABASE {db} TO "
                               f"{quote_ident(settings.database_role(component))}")
        # A schema made before the owner role existed (the bootstrap user owns it)
        # passes to the owner.
        for statement in await conn.fetch(_TRANSFER_OWNERSHIP, owner):
            await conn.execute(statement[0])
    finally:
        await conn.close()
    return await _migrate_and_grant(settings, owner)


async def _migrate_and_grant(settings: Settings, owner: str) -> list[str]:
    """Migrations as the owner role, then the grants (renewed for what they created)."""
    applied = await migrate(settings.database_url, owner=owner)
    await _grant(settings)
    return applied


async def _grant(settings: Settings) -> None:
    conn = await asyncpg.connect(settings.database_url)
    try:
        async with conn.transaction():
            for statement in grants(settings):
                await conn.execute(statement)
    finally:
        await conn.close()


_OTHER_OWNERS = """
SELECT DISTINCT r.rolname FROM (
    SELECT datdba AS owner FROM pg_database WHERE datname = current_database()
    UNION ALL
    SELECT c.relowner FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = 'public'
) o JOIN pg_roles r ON r.oid = o.owner
WHERE r.rolname LIKE '%\\_owner' AND r.rolname <> $1
"""


async def _refuse_others(conn: asyncpg.Connection, settings: Settings, doing: str) -> None:
    """``PermanentError`` when the database holds another namespace's objects (owned by
    another namespace's owner role): one namespace's setup never takes them over, and
    its removal never drops them."""
    others = [r["rolname"] for r in await conn.fetch(_OTHER_OWNERS,
                                                      settings.database_role("owner"))]
    if others:
        names = ", ".join(sorted(o.removesuffix("_owner") for o in others))
        raise PermanentError(
            f"database {database_name(settings.database_url)!r} holds objects of another "
            f"namespace ({names}): namespace {settings.namespace!r} will not {doing} there. "
            "Leave CASETRAIL_DATABASE_URL unset (each namespace then gets a database named "
            "after it) or point it at a database of this namespace's own.")


async def check_removable(settings: Settings) -> None:
    """``PermanentError`` when the namespace's database holds another namespace's
    objects (checked before anything of the namespace is taken down)."""
    await check_not_others(settings, "remove a database")


async def check_not_others(settings: Settings, doing: str) -> None:
    """``_refuse_others`` on the namespace's database, when it exists."""
    try:
        conn = await asyncpg.connect(settings.database_url)
    except asyncpg.InvalidCatalogNameError:
        return  # no database yet (or any more): nobody else's objects in it
    try:
        await _refuse_others(conn, settings, doing)
    finally:
        await conn.close()


async def remove_database(settings: Settings) -> None:
    """Drop the namespace's database and roles; refused (``PermanentError``) when the
    database holds another namespace's objects."""
    await check_removable(settings)
    readers = await _reader_roles(settings)
    await drop_database(settings.database_url)
    admin = await asyncpg.connect(with_database(settings.database_url, "postgres"))
    try:
        for role in [*readers, *(settings.database_role(c) for c in DATABASE_COMPONENTS),
                     settings.database_role("owner")]:
            await admin.execute(f"DROP ROLE IF EXISTS {quote_ident(role)}")
    finally:
        await admin.close()


async def _reader_roles(settings: Settings) -> list[str]:
    """The tenants' SQL reader roles made in the namespace's database (``casetrail
    sql-role create``): login roles of the cluster, which dropping the database leaves."""
    return await names_in(settings, "SELECT role_name FROM tenant_readers")


async def names_in(settings: Settings, query: str) -> list[str]:
    """The first column of ``query`` in the namespace's database; none when the
    database is gone (or unreachable) or never had the table."""
    try:
        conn = await asyncpg.connect(settings.database_url)
    except (OSError, asyncpg.PostgresError):
        return []
    try:
        return [r[0] for r in await conn.fetch(query)]
    except asyncpg.PostgresError:
        return []
    finally:
        await conn.close()


async def migrate_as_owner(settings: Settings) -> list[str]:
    """``casetrail migrate``: as the owner role when setup made one (then the grants
    are renewed for what the new files created), else as the bootstrap user."""
    owner = settings.database_role("owner")
    await ensure_database(settings.database_url)
    conn = await asyncpg.connect(settings.database_url)
    try:
        has_owner = await conn.fetchval("SELECT 1 FROM pg_roles WHERE rolname = $1", owner)
    finally:
        await conn.close()
    if not has_owner:
        return await migrate(settings.database_url)
    return await _migrate_and_grant(settings, owner)


async def subscriber_names(settings: Settings) -> list[str]:
    """The namespace's subscribers (none when its database is gone or never had them)."""
    return await names_in(settings, "SELECT name FROM subscribers")
