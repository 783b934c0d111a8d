"""``casetrail audit`` over the whole log, on the real stack: clean after real cases, then
an owner's deletions with the append-only triggers switched off and on again, an event
changed in place, a trigger left off — each found and named per case, by the command and
by its metrics."""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from pathlib import Path

import aio_pika
import asyncpg

from casetrail.config import Settings
from tests.support.helpers import wait_until
from tests.support.logged import (
    as_superuser,
    audit,
    found,
    logged_everything,
    metric_shows,
    run_cases,
    serving,
)
from tests.support.stack import free_port, kill_leftovers, namespace_of_its_own, spawn


async def test_the_audit_finds_every_deletion_and_change_an_owner_makes(
    settings: Settings, amqp: aio_pika.abc.AbstractRobustConnection, tmp_path: Path,
) -> None:
    children: dict[str, subprocess.Popen[bytes]] = {}
    async with namespace_of_its_own(settings, "audit") as (own, pool, key):
        try:
            async with serving(own, amqp, pool, key, children) as logged:
                await logged.start_ledger()
                shortened, deleted, changed = await run_cases(logged, 3)
                size, _ = await logged_everything(logged)
                code, report = await audit(own)
                assert code == 0 and report["clean"], report
                assert report["casesChecked"] == 3 and report["toLeaf"] == size
                # The next pass goes on from there: nothing new, nothing verified again.
                code, report = await audit(own)
                assert (code, report["fromLeaf"], report["casesChecked"]) == (0, size, 0)

                # As the owner: triggers off, two events of one case and a whole case
                # deleted, one stored event changed, triggers on again. No log line, no
                # alert at the time; the leaves stay.
                last_two = await pool.fetch(
                    "SELECT event_id FROM event_log WHERE case_id = $1 ORDER BY seq DESC "
                    "LIMIT 2", uuid.UUID(shortened))
                await as_superuser(
                    pool, "DELETE FROM event_log WHERE event_id = ANY($1::uuid[])",
                    args=([r["event_id"] for r in last_two],))
                await as_superuser(pool, f"DELETE FROM event_log WHERE case_id = '{deleted}'",
                                    f"DELETE FROM cases WHERE case_id = '{deleted}'")
                await as_superuser(
                    pool, "UPDATE event_log SET hash = repeat('0', 64) WHERE event_id = "
                    "(SELECT event_id FROM event_log WHERE case_id = $1 ORDER BY seq "
                    "LIMIT 1)", args=(uuid.UUID(changed),))
                code, report = await audit(own)
                assert code == 1, report
                assert {("removed_after_logging", shortened), ("removed_after_logging", deleted),
                        ("altered", changed)} <= found(report), report
                assert report["byKind"]["trigger_disabled"] == 0

                # A trigger left off is itself a finding.
                await pool.execute("ALTER TABLE event_log DISABLE TRIGGER "
                                   "event_log_no_update_or_delete")
                try:
                    code, report = await audit(own, "--full")
                finally:
                    await pool.execute("ALTER TABLE event_log ENABLE TRIGGER "
                                       "event_log_no_update_or_delete")
                assert code == 1 and report["fromLeaf"] == 0 and report["casesChecked"] == 3
                assert ("trigger_disabled", None) in found(report), report
                assert report["byKind"]["partition_unguarded"] == 0, report

                await _an_unguarded_partition_is_found(own, pool, uuid.UUID(changed))

                # An event taken out of the ledger's queue never becomes a leaf.
                await logged.stop_ledger()
                (unlogged,) = await run_cases(logged, 1)
                await pool.execute("DELETE FROM ledger_queue WHERE case_id = $1",
                                   uuid.UUID(unlogged))
                code, report = await audit(own)
                assert code == 1 and ("not_logged", unlogged) in found(report), report

                # Left running, it says so on its metrics port, every pass.
                port = free_port()
                children["auditor"] = spawn(own, "audit", "--every", "0.5",
                                            CASETRAIL_AUDITOR_METRICS_PORT=str(port))
                await wait_until(lambda: metric_shows(
                    port, 'casetrail_audit_findings{kind="removed_after_logging"} 2.0'),
                    timeout=60, interval=0.3)
                auditor = children.pop("auditor")
                auditor.terminate()
                await asyncio.to_thread(auditor.wait, 30)
                assert auditor.returncode == 0
                kept = await pool.fetchval("SELECT count(*) FROM audit_runs")
                assert kept >= 5
        finally:
            kill_leftovers(children)


async def _an_unguarded_partition_is_found(own: Settings, pool: asyncpg.Pool,
                                           case_id: uuid.UUID) -> None:
    # A month's partition whose key is gone (duplicates would be stored) or
    # that a role may reach directly is a finding too.
    month = await pool.fetchval(
        "SELECT tableoid::regclass::text FROM event_log WHERE case_id = $1 "
        "LIMIT 1", case_id)
    await pool.execute(f"ALTER TABLE {month} DROP CONSTRAINT "
                       f"{month}_case_attempt_seq")
    await pool.execute(f"GRANT SELECT ON {month} TO PUBLIC")
    code, report = await audit(own)
    assert code == 1, report
    (finding,) = [f for f in report["findings"]
                  if f["kind"] == "partition_unguarded"]
    assert month in finding["detail"] and "its unique key" in finding["detail"] \
        and "no grants" in finding["detail"], finding
    await pool.execute(f"REVOKE SELECT ON {month} FROM PUBLIC")
    await pool.execute(f"ALTER TABLE {month} ADD CONSTRAINT "
                       f"{month}_case_attempt_seq UNIQUE (case_id, attempt, seq) "
                       "INCLUDE (event_type)")
