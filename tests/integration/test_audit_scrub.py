"""An audit that misses nothing and cannot be talked out of it, tried as the database's
owner (no keys) on a stack of its own (docs/security.md, "The audit"): a payload
rewritten with its hash kept and the constraint put back, which every other check
passes, is found by the scrub; a clean run appended to make a failing case forgotten is
not believed; a run row the audit did not write never crashes a pass; a tombstone with
no signed CASE_EXPIRED behind it is a finding, never a 410, never counted as expired."""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from datetime import UTC, datetime

import aio_pika
import asyncpg
import pytest

from casetrail.adapters.store.audit_log import AuditStore
from casetrail.audit.audit_runs import Auditor, read_chain, seal_run
from casetrail.config import Settings
from casetrail.contract.integrity import Signer
from tests.support.logged import (
    Logged,
    as_superuser,
    audit,
    found,
    logged_everything,
    run_cases,
    serving,
)
from tests.support.stack import kill_leftovers, namespace_of_its_own

REWRITE_DECISION = (
    "UPDATE event_log SET payload = jsonb_set(payload, '{answer,decision}', '\"refer\"') "
    "WHERE case_id = $1 AND event_type = 'CASE_COMPLETED'")


async def test_the_audit_finds_an_owners_edit_and_is_not_talked_out_of_it(
    settings: Settings, amqp: aio_pika.abc.AbstractRobustConnection,
) -> None:
    children: dict[str, subprocess.Popen[bytes]] = {}
    async with namespace_of_its_own(settings, "scrub") as (own, pool, key):
        try:
            async with serving(own, amqp, pool, key, children) as logged:
                await logged.start_ledger()
                edited, _ = await run_cases(logged, 2)  # the first is approved
                await logged_everything(logged)
                code, report = await audit(own)
                assert code == 0 and report["clean"], report

                await as_superuser(pool, REWRITE_DECISION, args=(uuid.UUID(edited),))
                # Every check but the scrub passes it: the hash column still matches its
                # leaf, the constraint is in place (NOT VALID), the case was audited.
                unscrubbed = own.model_copy(update={"audit_scrub_seconds": 0})
                code, report = await audit(unscrubbed)
                assert code == 0 and report["casesScrubbed"] == 0, report
                code, report = await audit(own)
                assert code == 1 and ("altered", edited) in found(report), report
                assert "column_mismatch" in _detail(report, edited)
                assert report["scrubLapped"] is True and report["casesScrubbed"] >= 2

                await _runs_are_kept_signed_and_chained(own, logged)
                await _a_clean_run_appended_is_not_believed(own, logged, edited)
                await _a_run_the_audit_did_not_write_is_survived(own, logged, edited)
                await _a_forged_altered_or_removed_run_is_found(own, logged)
                await _a_forged_tombstone_is_a_finding_and_never_expired(own, logged)
        finally:
            kill_leftovers(children)


RUN_TRIGGERS = ("audit_runs_chain", "audit_runs_append_only", "audit_runs_no_truncate")


async def _unguarded(pool: asyncpg.Pool, statement: str, *args: object) -> None:
    """``statement`` run by the owner with audit_runs' triggers switched off, then on
    again (as they were: always)."""
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("ALTER TABLE audit_runs DISABLE TRIGGER USER")
        await conn.execute(statement, *args)
        for trigger in RUN_TRIGGERS:
            await conn.execute(f"ALTER TABLE audit_runs ENABLE ALWAYS TRIGGER {trigger}")


async def _runs_are_kept_signed_and_chained(own: Settings, logged: Logged) -> None:
    """Every pass is kept as a signed record under the auditor's registered key, each
    naming the hash of the one before, two auditors at once included; a run the audit
    did not sign is refused."""
    both = await asyncio.gather(audit(own), audit(own))
    assert [code for code, _ in both] == [1, 1], both
    rows = await logged.pool.fetch("SELECT * FROM audit_runs ORDER BY run_id")
    auditor = Auditor.of(own)
    keys = {auditor.signer.key_id: auditor.signer.public_key}
    chain = read_chain([dict(r) for r in rows], keys)
    assert len(rows) >= 3 and not chain.problems and chain.last is not None
    assert chain.next_seq == len(rows) and {r["key_id"] for r in rows} == set(keys)
    with pytest.raises(asyncpg.PostgresError, match="kept signed"):
        await logged.pool.execute(
            "INSERT INTO audit_runs (started_at, full_pass, from_leaf, to_leaf, "
            "cases_checked, findings) VALUES (now(), false, 0, 0, 0, '[]')")


async def _a_clean_run_appended_is_not_believed(own: Settings, logged: Logged,
                                                edited: str) -> None:
    """The owner appends a run with no findings (the chain's trigger off), so the next
    pass would not look at the failing case again: the run is named as unsigned and the
    pass checks the whole log."""
    await _unguarded(
        logged.pool,
        "INSERT INTO audit_runs (started_at, full_pass, from_leaf, to_leaf, cases_checked, "
        "findings) SELECT now(), false, to_leaf, to_leaf, 0, '[]' FROM audit_runs "
        "ORDER BY run_id DESC LIMIT 1")
    code, report = await audit(own)
    assert code == 1 and ("altered", edited) in found(report), report
    assert report["full"] is True and "unsigned" in _runs_detail(report), report


async def _a_run_the_audit_did_not_write_is_survived(own: Settings, logged: Logged,
                                                     edited: str) -> None:
    """Findings kept as a JSON string, or naming no case id, or a run past the tree: the
    pass does not crash; it says so and checks the whole log instead."""
    for findings, to_leaf in (('"[]"', 0), ('[{"caseId": "not-a-case"}]', 0),
                              ('[]', 10**9)):
        await _unguarded(
            logged.pool, "INSERT INTO audit_runs (started_at, full_pass, from_leaf, to_leaf, "
            "cases_checked, findings) VALUES (now(), false, 0, $1, 0, $2::jsonb)",
            to_leaf, findings)
        code, report = await audit(own)
        assert code == 1, report
        assert report["full"] is True and report["fromLeaf"] == 0, report
        assert ("audit_run_altered", None) in found(report), report
        assert ("altered", edited) in found(report), report
        assert await logged.pool.fetchval(  # kept as what it was: a whole pass
            "SELECT full_pass FROM audit_runs ORDER BY run_id DESC LIMIT 1") is True


async def _a_forged_altered_or_removed_run_is_found(own: Settings, logged: Logged) -> None:
    """A run the owner signs under a key of their own, chained as the trigger asks; a
    kept run's bytes rewritten with its hash kept, or only its findings column; a run
    removed from the middle of the chain, and the last ones from its end: each a
    finding naming what is wrong."""
    pool = logged.pool
    end = await pool.fetchrow("SELECT chain_seq, hash, to_leaf FROM audit_runs "
                              "WHERE chain_seq IS NOT NULL ORDER BY chain_seq DESC LIMIT 1")
    assert end is not None
    forged = seal_run(Signer.generate(), end["chain_seq"] + 1, end["hash"], {
        "startedAt": datetime.now(UTC).isoformat(), "finishedAt": datetime.now(UTC).isoformat(),
        "fullPass": False, "fromLeaf": end["to_leaf"], "toLeaf": end["to_leaf"],
        "casesChecked": 0, "findings": [], "scrubbedTo": None, "casesScrubbed": 0,
        "scrubLapped": False})
    seal = forged.integrity
    await AuditStore(pool).keep_run(forged.fields, forged.chain_seq, forged.body, seal)
    code, report = await audit(own)
    assert code == 1 and report["full"] is True, report
    assert "unknown_key" in _runs_detail(report), report

    first, second, third = await pool.fetch(
        "SELECT run_id FROM audit_runs WHERE chain_seq IS NOT NULL ORDER BY chain_seq LIMIT 3")
    await _unguarded(pool, "UPDATE audit_runs SET body = convert_to(replace(convert_from("
                     "body, 'UTF8'), '\"casesChecked\":', '\"casesChecked\":1'), 'UTF8') "
                     "WHERE run_id = $1", first["run_id"])
    await _unguarded(pool, "UPDATE audit_runs SET findings = '[]' WHERE run_id = $1",
                     second["run_id"])
    await _unguarded(pool, "DELETE FROM audit_runs WHERE run_id = $1", third["run_id"])
    code, report = await audit(own)
    detail = _runs_detail(report)
    assert code == 1 and f"audit run {first['run_id']} " in detail, report
    for problem in ("hash_mismatch", "columns_mismatch", "chain_broken"):
        assert problem in detail, (problem, report)

    await _unguarded(pool, "DELETE FROM audit_runs WHERE run_id IN (SELECT run_id FROM "
                     "audit_runs ORDER BY run_id DESC LIMIT 2)")
    code, report = await audit(own)
    assert code == 1 and "2 run(s) removed" in _runs_detail(report), report


def _runs_detail(report: dict[str, object]) -> str:
    findings = report["findings"]
    assert isinstance(findings, list)
    return " ".join(f["detail"] for f in findings if f["kind"] == "audit_run_altered")


async def _a_forged_tombstone_is_a_finding_and_never_expired(own: Settings,
                                                             logged: Logged) -> None:
    """A tombstone the owner writes for a case that never expired (none stored): the
    API does not answer 410 "expired", the audit names it and counts no expiry."""
    ghost = uuid.uuid4()
    policy = await logged.pool.fetchval("SELECT max(policy_id) FROM retention_policies")
    await logged.pool.execute(
        "INSERT INTO case_tombstones (case_id, tenant_id, event_id, event_hash, policy_id, "
        "policy_version, events_removed, heads, expired_by, expired_at) VALUES ($1, "
        "'default', gen_random_uuid(), repeat('0', 64), $2, 1, 3, '[]', 'retention:1', "
        "now())", ghost, policy or 1)
    reply = await logged.client.get(f"/cases/{ghost}")
    assert reply.status_code == 404, reply.text
    assert "no signed CASE_EXPIRED verifies it" in reply.text, reply.text
    verdict = (await logged.client.get(f"/cases/{ghost}/verify")).json()
    assert verdict["verified"] is False, verdict
    code, report = await audit(own)
    assert code == 1 and ("altered", str(ghost)) in found(report), report
    assert report["casesExpired"] == 0, report


def _detail(report: dict[str, object], case_id: str) -> str:
    findings = report["findings"]
    assert isinstance(findings, list)
    return " ".join(f["detail"] for f in findings if f.get("caseId") == case_id)
