"""Retention and restores (real Postgres, real RabbitMQ, `pg_dump` / `pg_restore`): a hold
placed and an erasure made after a backup are not undone by restoring it. The workers'
retention pass does not run while the restored database lacks what the journal holds,
and `casetrail setup` (the runbook's second one) makes it again."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import aio_pika
from prometheus_client import REGISTRY

from casetrail.config import Settings
from casetrail.ops.retention_journal import reapply
from tests.support.helpers import wait_for_sql
from tests.support.logged import back_up, restore, serving
from tests.support.retention import aclose_all, backdate, cast, decided, keeper_of
from tests.support.stack import kill_leftovers, namespace_of_its_own


async def test_holds_and_erasures_made_after_a_backup_survive_its_restore(
    settings: Settings, amqp: aio_pika.abc.AbstractRobustConnection, tmp_path: Path,
) -> None:
    children: dict[str, subprocess.Popen[bytes]] = {}
    async with namespace_of_its_own(settings, "retain-restore") as (own, pool, key):
        try:
            async with serving(own, amqp, pool, key, children) as logged:
                base = logged.stack.base_url
                people = await cast(pool, base)
                alice, bob, carol, admin = (people[w] for w in ("alice", "bob", "carol",
                                                                 "admin"))
                held, erased = await decided(logged.client, 2)
                policy = (await alice.put("/retention/policies/*", json={
                    "preset": "ai-act-minimum", "reason": "six months"})).json()
                assert (await bob.post(f"/retention/policies/{policy['policyId']}/approve")
                        ).status_code == 200
                for case_id in (held, erased):
                    await backdate(pool, case_id, 200)
                backup = tmp_path / "before-the-hold.dump"
                await back_up(own, backup)

                # After the backup: a hold, and an erasure of personal data.
                hold = await carol.post("/holds", json={"scope": "case", "caseId": held,
                                                        "reason": "Complaint 2026-114"})
                assert hold.status_code == 201, hold.text
                assert (await admin.post(f"/cases/{erased}/erase")).status_code == 202
                await restore(own, pool, backup)
                assert await pool.fetchval("SELECT count(*) FROM legal_holds") == 0
                assert await pool.fetchval("SELECT count(*) FROM case_secrets WHERE "
                                           "erased_at IS NULL") == 2

                # The pass sees the database lacks what the journal holds: nothing goes.
                keeper = keeper_of(logged.stack.worker)
                blocked = await keeper.pass_once()
                assert blocked.blocked == 2 and blocked.expiries_appended == 0, blocked
                assert REGISTRY.get_sample_value("casetrail_retention_blocked") == 1

                # The runbook's second setup makes both again; then the pass runs, and
                # the held case stays.
                made = await reapply(own)
                assert sorted(m.split()[0] for m in made) == ["erasure", "hold"], made
                assert await pool.fetchval("SELECT erased_at IS NOT NULL FROM case_secrets "
                                           "WHERE case_id = $1", uuid.UUID(erased))
                after = await keeper.pass_once()
                assert (after.blocked, after.held, after.expiries_appended) == (0, 1, 1), after
                await wait_for_sql(pool, "SELECT count(*) FROM case_tombstones WHERE "
                                   "case_id = $1", uuid.UUID(erased))
                assert await reapply(own) == []  # nothing lacking any more
                await aclose_all(people)
        finally:
            kill_leftovers(children)
