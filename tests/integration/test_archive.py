"""Archive before expiry on the real stack: under a policy that archives, each case's
bundle goes to the archive (signed manifest) before its CASE_EXPIRED, which names the
file and its digest; the database refuses to expire a case of such a policy whose
tombstone names no archive; `casetrail archive verify` checks the archive offline and
catches a changed, missing or unlisted file; no personal data is in it in clear. The same
in an S3 bucket with Object Lock, served by moto's standalone S3 server over HTTP."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg
import boto3
import orjson
import pytest
from botocore.exceptions import ClientError

from casetrail.agents.loan_officer import SAMPLE_APPLICATIONS
from casetrail.config import Settings
from casetrail.trail.keyfile import worker_signer
from tests.support.cli import run_cli
from tests.support.helpers import wait_for_sql
from tests.support.logged import as_superuser, logged_everything, serving
from tests.support.retention import aclose_all, backdate, cast, decided, keeper_of
from tests.support.stack import kill_leftovers, namespace_of_its_own


async def test_an_archiving_policy_archives_each_case_before_it_expires(
    settings: Settings, amqp: aio_pika.abc.AbstractRobustConnection,
) -> None:
    children: dict[str, subprocess.Popen[bytes]] = {}
    async with namespace_of_its_own(settings, "archive") as (own, pool, key):
        try:
            async with serving(own, amqp, pool, key, children) as logged:
                await logged.start_ledger()
                people = await cast(pool, logged.stack.base_url)
                try:
                    await _archive_then_expire(own, pool, logged, people)
                finally:
                    await aclose_all(people)
        finally:
            kill_leftovers(children)


async def _archive_then_expire(own: Settings, pool: asyncpg.Pool, logged: Any,
                               people: dict[str, Any]) -> None:
    keeper = keeper_of(logged.stack.worker)
    archive = own.archive_path()
    cases = await decided(logged.client, 2)
    set_ = await people["alice"].put("/retention/policies/*", json={
        "preset": "sec-17a-4", "archive": True,
        "reason": "Broker-dealer records: six years, archived to the WORM volume."})
    assert set_.status_code == 201 and set_.json()["archive"] is True, set_.text
    policy = set_.json()
    assert (await people["bob"].post(
        f"/retention/policies/{policy['policyId']}/approve")).status_code == 200
    for case_id in cases:
        await backdate(pool, case_id, 2200)
    await logged_everything(logged)
    planned = (await people["alice"].get("/retention/plan")).json()  # the dry run says so
    assert planned["wouldArchive"] == 2 and all(c["archivedFirst"] for c in planned["cases"]
                                                if c["caseId"] in cases), planned

    first = await keeper.pass_once()
    assert (first.archived, first.expiries_appended, first.awaiting_archive) == (2, 2, 0), \
        first
    for case_id in cases:
        await wait_for_sql(pool, "SELECT count(*) FROM case_tombstones WHERE case_id = $1 "
                           "AND archive IS NOT NULL", uuid.UUID(case_id))
    named = await pool.fetchval(
        "SELECT payload -> 'archive' FROM event_log WHERE case_id = $1 AND event_type = "
        "'CASE_EXPIRED'", uuid.UUID(cases[0]))
    file = archive / named["file"]
    assert hashlib.sha256(file.read_bytes()).hexdigest() == named["sha256"], named
    bundle = orjson.loads(file.read_bytes())
    assert bundle["caseId"] == cases[0] and all("logProof" in e for e in bundle["events"])
    # No personal data in clear: the applicant's name is only a placeholder and sealed.
    name = SAMPLE_APPLICATIONS[0]["applicantName"]
    assert name.encode() not in file.read_bytes()
    assert bundle["sealed"]["ciphertext"] and "wrappedKey" not in bundle["sealed"]

    await logged_everything(logged)
    second = await keeper.pass_once()
    assert second.expired == 2, second
    assert (await people["admin"].get(f"/cases/{cases[0]}/verify")).json()["verified"]
    await _verified_offline(own, logged, archive)
    await _dropping_the_archive_takes_two(people, policy)
    await _the_database_refuses_an_unarchived_expiry(pool, policy)


async def _verified_offline(own: Settings, logged: Any, archive: Path | str) -> None:
    assert isinstance(archive, Path)
    trust = base64.b64encode(worker_signer(own).public_key).decode()

    def check(*extra: str) -> subprocess.CompletedProcess[str]:
        return run_cli(own, "archive", "verify", str(archive), "--trust", trust,
                       "--trust-log", logged.log_key.text(), *extra)

    done = await asyncio.to_thread(check, "--log", logged.stack.base_url)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "verified: 1 manifests, 2 of 2 bundles verified" in done.stdout, done.stdout
    # A changed file, a file no manifest lists, a manifest changed after it was signed.
    bundle = next((archive / "bundles").rglob("*.json"))
    original = bundle.read_bytes()
    bundle.write_bytes(original.replace(b'"completed"', b'"cancelled"', 1))
    stray = bundle.with_name("stray.json")
    stray.write_bytes(original)
    manifest = next((archive / "manifests").glob("*.json"))
    signed = manifest.read_bytes()
    try:
        caught = await asyncio.to_thread(check, "--json")
        assert caught.returncode == 1, caught.stdout + caught.stderr
        kinds = {(p["kind"], Path(p["file"]).name)
                 for p in orjson.loads(caught.stdout)["problems"]}
        assert kinds == {("digest", bundle.name), ("unlisted", "stray.json")}, kinds
        manifest.write_bytes(signed.replace(b'"events": ', b'"events": 1', 1))
        forged = await asyncio.to_thread(check)
        assert forged.returncode == 1 and "signature does not hold" in forged.stdout, \
            forged.stdout
    finally:
        bundle.write_bytes(original)
        manifest.write_bytes(signed)
        stray.unlink()
    untrusted = await asyncio.to_thread(
        run_cli, own, "archive", "verify", str(archive), "--trust",
        base64.b64encode(b"\x01" * 32).decode())
    assert untrusted.returncode == 1 and "which you do not trust" in untrusted.stdout


async def _dropping_the_archive_takes_two(people: dict[str, Any],
                                          policy: dict[str, Any]) -> None:
    dropped = await people["alice"].put("/retention/policies/*", json={
        "preset": "sec-17a-4", "reason": "No more archive."})
    assert dropped.status_code == 201 and dropped.json()["needsSecondPerson"] is True, \
        dropped.text
    assert dropped.json()["archive"] is False and policy["archive"] is True


async def _the_database_refuses_an_unarchived_expiry(pool: asyncpg.Pool,
                                                     policy: dict[str, Any]) -> None:
    """A tombstone of an archiving policy that names no archive: expire_case refuses."""
    case_id = uuid.uuid4()
    await as_superuser(
        pool, "INSERT INTO case_tombstones (case_id, tenant_id, event_id, event_hash, "
        "policy_id, policy_version, events_removed, heads, expired_by, expired_at) VALUES "
        f"('{case_id}', 'default', gen_random_uuid(), repeat('0', 64), "
        f"{policy['policyId']}, 1, 1, '[]', 'test', now())")
    with pytest.raises(asyncpg.PostgresError, match="names no archive"):
        await pool.fetchval("SELECT expire_case($1)", case_id)


@pytest.fixture
def bucket(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, dict[str, str]]]:
    """A local S3 server with a bucket whose objects are WORM (Object Lock, compliance
    mode): its endpoint and the AWS variables that reach it."""
    from moto.server import ThreadedMotoServer

    aws = {"AWS_ACCESS_KEY_ID": "archive-tests", "AWS_SECRET_ACCESS_KEY": "archive-tests",
           "AWS_DEFAULT_REGION": "us-east-1"}
    for name, value in aws.items():
        monkeypatch.setenv(name, value)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    client = boto3.client("s3", endpoint_url=endpoint)
    client.create_bucket(Bucket="evidence", ObjectLockEnabledForBucket=True)
    client.put_object_lock_configuration(Bucket="evidence", ObjectLockConfiguration={
        "ObjectLockEnabled": "Enabled",
        "Rule": {"DefaultRetention": {"Mode": "COMPLIANCE", "Years": 7}}})
    try:
        yield endpoint, aws
    finally:
        server.stop()


async def test_an_archive_in_an_s3_bucket_is_written_once_and_verifies_offline(
    settings: Settings, amqp: aio_pika.abc.AbstractRobustConnection,
    bucket: tuple[str, dict[str, str]],
) -> None:
    endpoint, aws = bucket
    children: dict[str, subprocess.Popen[bytes]] = {}
    async with namespace_of_its_own(settings, "archive-s3",
                                    archive_dir="s3://evidence/casetrail",
                                    archive_s3_endpoint=endpoint) as (own, pool, key):
        try:
            async with serving(own, amqp, pool, key, children) as logged:
                await logged.start_ledger()
                people = await cast(pool, logged.stack.base_url)
                try:
                    await _archive_to_the_bucket(own, pool, logged, people, endpoint, aws)
                finally:
                    await aclose_all(people)
        finally:
            kill_leftovers(children)


async def _archive_to_the_bucket(own: Settings, pool: asyncpg.Pool, logged: Any,
                                 people: dict[str, Any], endpoint: str,
                                 aws: dict[str, str]) -> None:
    keeper = keeper_of(logged.stack.worker)
    (case_id,) = await decided(logged.client, 1)
    set_ = await people["alice"].put("/retention/policies/*", json={
        "preset": "sec-17a-4", "archive": True, "reason": "Six years, archived to S3."})
    assert (await people["bob"].post(
        f"/retention/policies/{set_.json()['policyId']}/approve")).status_code == 200
    await backdate(pool, case_id, 2200)
    await logged_everything(logged)
    first = await keeper.pass_once()
    assert (first.archived, first.expiries_appended) == (1, 1), first
    await wait_for_sql(pool, "SELECT count(*) FROM case_tombstones WHERE case_id = $1 "
                       "AND archive IS NOT NULL", uuid.UUID(case_id))
    named = await pool.fetchval(
        "SELECT payload -> 'archive' FROM event_log WHERE case_id = $1 AND event_type = "
        "'CASE_EXPIRED'", uuid.UUID(case_id))
    client = boto3.client("s3", endpoint_url=endpoint)
    stored = client.get_object(Bucket="evidence", Key=f"casetrail/{named['file']}")
    assert hashlib.sha256(stored["Body"].read()).hexdigest() == named["sha256"]
    assert stored["ObjectLockMode"] == "COMPLIANCE"  # WORM as written
    await logged_everything(logged)
    assert (await keeper.pass_once()).expired == 1

    trust = base64.b64encode(worker_signer(own).public_key).decode()

    def check() -> subprocess.CompletedProcess[str]:
        return run_cli(own, "archive", "verify", "s3://evidence/casetrail", "--trust", trust,
                       "--trust-log", logged.log_key.text(), "--log",
                       logged.stack.base_url, "--json", **aws,
                       CASETRAIL_ARCHIVE_S3_ENDPOINT=endpoint)

    done = await asyncio.to_thread(check)
    assert done.returncode == 0, done.stdout + done.stderr
    assert orjson.loads(done.stdout)["verified"] == 1
    # Locked objects cannot be deleted; a new version put over one is caught.
    versions = client.list_object_versions(Bucket="evidence")["Versions"]
    with pytest.raises(ClientError, match="AccessDenied"):
        client.delete_object(Bucket="evidence", Key=versions[0]["Key"],
                             VersionId=versions[0]["VersionId"])
    client.put_object(Bucket="evidence", Key=f"casetrail/{named['file']}", Body=b"{}")
    caught = await asyncio.to_thread(check)
    assert caught.returncode == 1, caught.stdout + caught.stderr
    assert [p["kind"] for p in orjson.loads(caught.stdout)["problems"]] == ["digest"]
