"""A trail that proves itself, attacked (real broker, real Postgres, real uvicorn).

Forgeries on the bus are dead-lettered with the reason and never touch ``cases``;
a superuser's edits and deletions in ``event_log`` are named by ``verify`` at the
attempt and seq where they were made; a bundle checks offline and notices a flipped
byte, a removed or swapped cycle and a key nobody trusts.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg
import httpx
import orjson
import pytest

from casetrail.adapters.bus.publisher import Publisher
from casetrail.adapters.bus.topology import Topology
from casetrail.adapters.store import KeyRegistry
from casetrail.agents.loan_officer import SAMPLE_APPLICATIONS
from casetrail.config import Settings
from casetrail.consumers.admission import Admission, KeyRing, Refused
from casetrail.contract.events import CaseCompletedPayload, TokenUsage, make_event
from casetrail.contract.integrity import GENESIS, HEADER, Signer, canonical, public_key_text
from tests.support.cli import DOCS, STANDALONE_VERIFIER, check_bundle, run_cli
from tests.support.helpers import dead_letter_for, ended
from tests.support.records import as_legacy_row, forge_tool_result, tamper
from tests.support.stack import module_stack

APPROVE, DECLINE = SAMPLE_APPLICATIONS[0], SAMPLE_APPLICATIONS[2]


stack = module_stack(worker_concurrency=4)


async def decided(client: httpx.AsyncClient, application: dict[str, Any] = DECLINE) -> str:
    reply = await client.post("/cases", json={"agent": "loan-officer", "input": application})
    assert reply.status_code == 202, reply.text
    case_id: str = reply.json()["caseId"]
    assert (await ended(client, case_id))["status"] == "completed"
    return case_id


async def verify(client: httpx.AsyncClient, case_id: str) -> dict[str, Any]:
    reply = await client.get(f"/cases/{case_id}/verify")
    assert reply.status_code == 200
    report: dict[str, Any] = reply.json()
    return report


def codes(report: dict[str, Any]) -> list[tuple[int | None, int | None, str]]:
    return [(p["attempt"], p["seq"], p["code"]) for p in report["problems"]]


async def forge(amqp: aio_pika.abc.AbstractRobustConnection, topology: Topology,
                case_id: str, seq: int, *, signer: Signer | None, prev_hash: str = GENESIS,
                tamper_hash: bool = False, integrity: bool = True) -> str:
    """Publish a well-formed CASE_COMPLETED {"decision": "approve"} for ``case_id``, as
    anyone holding the worker's broker credentials could (no other user may publish
    ``case.*``: see test_least_privilege); returns its message id."""
    event = make_event(uuid.UUID(case_id), 1, seq, CaseCompletedPayload(
        cycles_completed=1, token_totals=TokenUsage(input_tokens=1, output_tokens=1),
        answer={"decision": "approve"}))
    body = event.to_json()
    headers: dict[str, Any] = {}
    if integrity:
        sealed = (signer or Signer.generate()).seal(prev_hash, body)
        fields = sealed.as_json()
        if tamper_hash:
            fields["hash"] = "f" * 64
        headers[HEADER] = fields
    publisher = await Publisher.open(amqp)
    await publisher.publish(topology.events_exchange, event.routing_key, body,
                            message_id=str(event.event_id), message_type=event.event_type,
                            correlation_id=case_id, headers=headers)
    await publisher.channel.close()
    return str(event.event_id)


@pytest.mark.parametrize(("how", "reason"), [
    ({"signer": None, "integrity": False}, "not signed"),
    ({"signer": "worker", "tamper_hash": True}, "hash_mismatch"),
    ({"signer": None}, "unknown_key"),
])
async def test_a_forged_terminal_event_is_dead_lettered_and_the_decision_stands(
    client: httpx.AsyncClient, amqp: aio_pika.abc.AbstractRobustConnection,
    worker_amqp: aio_pika.abc.AbstractRobustConnection,
    topology: Topology, signer: Signer, pool: asyncpg.Pool, how: dict[str, Any], reason: str,
) -> None:
    case_id = await decided(client)  # declined
    before = await pool.fetchval("SELECT count(*) FROM event_log WHERE case_id = $1",
                                 uuid.UUID(case_id))
    # The forgery takes the next free seq, so only the signature stands in its way.
    options = {**how, "signer": signer if how.get("signer") == "worker" else None}
    message_id = await forge(worker_amqp, topology, case_id, before, **options)
    assert reason in await dead_letter_for(amqp, topology, message_id)
    case = (await client.get(f"/cases/{case_id}")).json()
    assert case["answer"]["decision"] == "decline"
    assert case["integrity"]["verified"] is True
    assert await pool.fetchval("SELECT count(*) FROM event_log WHERE case_id = $1",
                               uuid.UUID(case_id)) == before


async def test_an_event_replayed_onto_another_case_changes_neither(
    client: httpx.AsyncClient, worker_amqp: aio_pika.abc.AbstractRobustConnection,
    topology: Topology, pool: asyncpg.Pool,
) -> None:
    first, second = await decided(client, APPROVE), await decided(client, DECLINE)
    row = await pool.fetchrow(
        "SELECT body, prev_hash, hash, key_id, sig, event_id FROM event_log "
        "WHERE case_id = $1 AND event_type = 'CASE_COMPLETED'", uuid.UUID(first))
    assert row is not None
    integrity = {"prevHash": row["prev_hash"], "hash": row["hash"], "keyId": row["key_id"],
                 "sig": row["sig"]}
    publisher = await Publisher.open(worker_amqp)
    await publisher.publish(topology.events_exchange,
                            f"case.default.{second}.CASE_COMPLETED", bytes(row["body"]),
                            message_id=str(row["event_id"]), headers={HEADER: integrity})
    await publisher.channel.close()
    await asyncio.sleep(0.5)  # the consumer has seen it by now
    for case_id, decision in ((first, "approve"), (second, "decline")):
        case = (await client.get(f"/cases/{case_id}")).json()
        assert case["answer"]["decision"] == decision
        assert (await verify(client, case_id))["verified"] is True
    assert await pool.fetchval("SELECT count(*) FROM event_log WHERE event_id = $1",
                               row["event_id"]) == 1






async def test_a_superuser_edit_of_a_tool_result_is_named_at_its_seq(
    client: httpx.AsyncClient, pool: asyncpg.Pool,
) -> None:
    case_id = uuid.UUID(await decided(client))
    seq = await pool.fetchval(
        "SELECT seq FROM event_log WHERE case_id = $1 AND event_type = 'REACT_CYCLE' "
        "AND jsonb_array_length(payload -> 'toolCalls') > 0 ORDER BY seq LIMIT 1", case_id)
    edit = """UPDATE event_log SET payload = jsonb_set(payload,
              '{toolCalls,0,toolResult}', '{"score": 850}') WHERE case_id = $1 AND seq = $2"""
    # With the append-only trigger off, the constraint still holds the queried column to
    # the signed bytes: a constraint is not a trigger.
    with pytest.raises(asyncpg.CheckViolationError, match="event_log_restates_body"):
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute(
                "ALTER TABLE event_log DISABLE TRIGGER event_log_no_update_or_delete")
            await conn.execute(edit, case_id, seq)
    # In the queried column only, the constraint dropped as well: the signed bytes still
    # say what happened, and verification names the column.
    await tamper(pool, edit, case_id, seq)
    report = await verify(client, str(case_id))
    assert report["verified"] is False
    assert codes(report) == [(1, seq, "column_mismatch")]
    assert "payload" in report["problems"][0]["message"]
    # In the signed bytes only: the hash no longer matches them.
    await tamper(pool, "UPDATE event_log SET payload = (convert_from(body, 'UTF8')::jsonb) "
                       "-> 'payload' WHERE case_id = $1 AND seq = $2", case_id, seq)
    assert (await verify(client, str(case_id)))["verified"] is True
    await forge_tool_result(pool, case_id, seq)
    report = await verify(client, str(case_id))
    assert (1, seq, "hash_mismatch") in codes(report)
    assert {s for _, s, _ in codes(report)} == {seq}


async def test_a_deleted_middle_cycle_and_a_deleted_terminal_event_are_named(
    client: httpx.AsyncClient, pool: asyncpg.Pool,
) -> None:
    case_id = uuid.UUID(await decided(client))
    await tamper(pool, "DELETE FROM event_log WHERE case_id = $1 AND seq = 2", case_id)
    report = await verify(client, str(case_id))
    assert (1, 3, "seq_gap") in codes(report) and (1, 3, "broken_link") in codes(report)
    assert "seq 2 is missing" in report["problems"][0]["message"]

    other = uuid.UUID(await decided(client))
    await tamper(pool, "DELETE FROM event_log WHERE case_id = $1 "
                       "AND event_type = 'CASE_COMPLETED'", other)
    report = await verify(client, str(other))
    assert report["verified"] is False and report["complete"] is False
    assert [c for _, _, c in codes(report)] == ["missing_terminal"]
    case = (await client.get(f"/cases/{other}")).json()
    assert case["integrity"] == {"verified": False, "complete": False,
                                 "checkedAt": case["integrity"]["checkedAt"],
                                 "problems": ["missing_terminal"]}


async def test_version_1_events_verify_as_unsigned(
    client: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    case_id = uuid.uuid4()
    await pool.execute(
        "INSERT INTO cases (case_id, agent, input, model, limits, request_digest, status) "
        "VALUES ($1, 'loan-officer', '{}', '{}', '{}', 'd', 'completed')", case_id)
    await as_legacy_row(
        pool, "INSERT INTO event_log (event_id, case_id, attempt, seq, event_type, "
        "occurred_at, schema_version, payload) VALUES ($1, $2, 1, 0, 'CASE_COMPLETED', now(), "
        "1, '{}')", uuid.uuid4(), case_id)
    report = await verify(client, str(case_id))
    assert codes(report) == [(1, 0, "unsigned")]
    assert "version-1" in report["problems"][0]["message"]


async def test_a_retired_key_signs_nothing_more(
    pool: asyncpg.Pool, settings: Settings
) -> None:
    registry = KeyRegistry(pool)
    old = Signer.generate()
    await registry.register(old.key_id, old.public_key)
    ring = KeyRing(registry)
    await ring.refresh(force=True)
    admission = Admission(settings.broker_user("worker"), ring)
    event = make_event(uuid.uuid4(), 1, 0, CaseCompletedPayload(
        cycles_completed=0, token_totals=TokenUsage(input_tokens=0, output_tokens=0),
        answer={"decision": "approve"}))
    body = event.to_json()
    headers = {HEADER: old.seal(GENESIS, body).as_json()}
    assert admission.admit(body, headers, settings.broker_user("worker")).event == event
    with pytest.raises(Refused, match="user_id 'someone-else'"):
        admission.admit(body, headers, "someone-else")
    assert await registry.retire(old.key_id) == "retired"
    await ring.refresh(force=True)
    with pytest.raises(Refused, match="retired_key"):
        admission.admit(body, headers, settings.broker_user("worker"))
    assert await registry.retire("0123456789abcdef") == "unknown"




@pytest.fixture
async def bundle_file(client: httpx.AsyncClient, settings: Settings, tmp_path: Path) -> Path:
    case_id = await decided(client, APPROVE)
    path = tmp_path / "case.bundle.json"
    done = await asyncio.to_thread(run_cli, settings, "export", case_id, "-o", str(path))
    assert done.returncode == 0, done.stderr
    api_bundle = (await client.get(f"/cases/{case_id}/bundle")).json()
    exported = orjson.loads(path.read_bytes())
    assert exported["events"] == api_bundle["events"]
    assert exported["format"] == "casetrail-bundle/1"
    return path




def rewrite(path: Path, change: Any) -> Path:
    bundle = orjson.loads(path.read_bytes())
    change(bundle)
    out = path.with_name(f"changed-{uuid.uuid4().hex[:6]}.json")
    out.write_bytes(orjson.dumps(bundle))
    return out


def flip_a_byte(bundle: dict[str, Any]) -> None:
    body = bundle["events"][2]["body"]
    changed = body.replace('"cycleIndex":1', '"cycleIndex":7', 1)
    assert changed != body and len(changed) == len(body)
    bundle["events"][2]["body"] = changed


def remove_a_cycle(bundle: dict[str, Any]) -> None:
    del bundle["events"][2]


def swap_two_cycles(bundle: dict[str, Any]) -> None:
    events = bundle["events"]
    one, two = copy.deepcopy(events[1]), copy.deepcopy(events[2])
    for target, source in ((events[1], two), (events[2], one)):
        target["body"], target["integrity"] = source["body"], source["integrity"]


async def test_a_bundle_verifies_offline_and_names_each_change(
    bundle_file: Path, settings: Settings, signer: Signer, tmp_path: Path,
) -> None:
    trusted = public_key_text(signer.public_key)
    key_file = tmp_path / "trusted.pub"
    key_file.write_text(trusted + "\n")
    checks = await asyncio.gather(
        asyncio.to_thread(check_bundle, settings, bundle_file, trusted),
        asyncio.to_thread(check_bundle, settings, bundle_file, str(key_file)),
        asyncio.to_thread(check_bundle, settings, rewrite(bundle_file, flip_a_byte), trusted),
        asyncio.to_thread(check_bundle, settings, rewrite(bundle_file, remove_a_cycle),
                          trusted),
        asyncio.to_thread(check_bundle, settings, rewrite(bundle_file, swap_two_cycles),
                          trusted),
        asyncio.to_thread(check_bundle, settings, bundle_file,
                          base64.b64encode(os.urandom(32)).decode()),
        asyncio.to_thread(check_bundle, settings, tmp_path / "missing.json", trusted),
    )
    ok, ok_from_file, flipped, removed, swapped, foreign, missing = checks
    assert (ok.returncode, ok_from_file.returncode) == (0, 0), ok.stderr
    assert "verified: 6 events" in ok.stdout
    assert flipped.returncode == 1 and "attempt 1 seq 2: hash_mismatch" in flipped.stderr
    assert removed.returncode == 1 and "attempt 1 seq 3: seq_gap" in removed.stderr
    assert swapped.returncode == 1 and "attempt 1 seq 1: broken_link" in swapped.stderr
    assert foreign.returncode == 1 and "unknown_key" in foreign.stderr
    assert missing.returncode == 2 and "could not check" in missing.stderr
    # The standalone verifier of docs/bundle.md, which shares no code with casetrail.
    standalone = STANDALONE_VERIFIER
    alone_ok, alone_bad = [
        await asyncio.to_thread(subprocess.run, [sys.executable, str(standalone), str(path),
                                                 "--trust", trusted],
                                capture_output=True, text=True, check=False)
        for path in (bundle_file, rewrite(bundle_file, flip_a_byte))]
    assert alone_ok.returncode == 0 and "verified: 6 events, complete" in alone_ok.stdout
    assert alone_bad.returncode == 1 and "attempt 1 seq 2: hash_mismatch" in alone_bad.stdout
    # A key the auditor trusts only until a time: the standalone verifier, which checks
    # no witness, cannot tell when an event was signed, so it refuses them.
    alone_retired = await asyncio.to_thread(
        subprocess.run, [sys.executable, str(standalone), str(bundle_file), "--trust",
                         f"{trusted}@2020-01-01T00:00:00Z"],
        capture_output=True, text=True, check=False)
    assert alone_retired.returncode == 1 and "retired_key" in alone_retired.stdout


async def test_the_same_answers_from_the_command_line(
    client: httpx.AsyncClient, settings: Settings, pool: asyncpg.Pool
) -> None:
    case_id = await decided(client)
    good, unknown = await asyncio.gather(
        asyncio.to_thread(run_cli, settings, "verify", case_id),
        asyncio.to_thread(run_cli, settings, "verify", str(uuid.uuid4())))
    assert good.returncode == 0 and "verified" in good.stdout
    assert unknown.returncode == 2
    await tamper(pool, "DELETE FROM event_log WHERE case_id = $1 AND seq = 1",
                 uuid.UUID(case_id))
    bad = await asyncio.to_thread(run_cli, settings, "verify", case_id)
    assert bad.returncode == 1 and "attempt 1 seq 2: seq_gap" in bad.stderr
    down = await asyncio.to_thread(run_cli, settings, "verify", case_id,
                                   CASETRAIL_DATABASE_URL="postgresql://x@127.0.0.1:1/none")
    assert down.returncode == 2 and "could not check" in down.stderr


async def test_a_worker_without_a_signing_key_refuses_to_start(settings: Settings) -> None:
    done = await asyncio.to_thread(run_cli, settings, "worker", CASETRAIL_SIGNING_KEY_FILE="")
    assert done.returncode == 2
    assert "CASETRAIL_SIGNING_KEY_FILE is not set" in done.stderr


async def test_signing_keys_are_public_and_the_signer_commands_agree(
    client: httpx.AsyncClient, settings: Settings, signer: Signer, tmp_path: Path
) -> None:
    keys = (await client.get("/signing-keys")).json()["keys"]
    assert {"keyId": signer.key_id, "publicKey": public_key_text(signer.public_key)} \
        .items() <= next(k for k in keys if k["keyId"] == signer.key_id).items()
    path = tmp_path / "new.pem"
    made = await asyncio.to_thread(run_cli, settings, "signer", "generate", "-o", str(path))
    shown = await asyncio.to_thread(run_cli, settings, "signer", "public", str(path))
    again = await asyncio.to_thread(run_cli, settings, "signer", "generate", "-o", str(path))
    assert made.returncode == 0 and made.stdout == shown.stdout
    assert again.returncode == 2 and "never overwritten" in again.stderr
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_the_chain_rules_match_the_documented_vector() -> None:
    """The first test vector of docs/bundle.md, computed here from its inputs."""
    seed = bytes(range(32))
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    signer = Signer(Ed25519PrivateKey.from_private_bytes(seed))
    body = canonical({"b": [1, 2.5, "é"], "a": True})
    assert body == '{"a":true,"b":[1,2.5,"é"]}'.encode()
    sealed = signer.seal(GENESIS, body)
    doc = (DOCS / "bundle.md").read_text()
    for value in (public_key_text(signer.public_key), signer.key_id, sealed.hash, sealed.sig):
        assert value in doc, value


async def test_batches_that_meet_a_new_key_at_once_all_wait_for_its_read(
    pool: asyncpg.Pool,
) -> None:
    """A worker registers its key and publishes at once; the consumer read the keys a
    moment before. Every batch that names the new key waits, then reads: a read skipped
    as "too soon after the last" (another batch's read in progress, or a timer that
    fired a hair early, as uvloop's do) checked the batch against the old keys and
    dead-lettered its events as signed by an unknown key (seen once in the demo)."""
    registry = KeyRegistry(pool)
    ring = KeyRing(registry)
    await ring.refresh(force=True)
    newcomer = Signer.generate()
    await registry.register(newcomer.key_id, newcomer.public_key)

    async def batch() -> bool:
        await ring.knows_all({newcomer.key_id})
        return newcomer.key_id in ring.keys  # what admitting the batch now would see

    assert await asyncio.gather(*(batch() for _ in range(3))) == [True, True, True]

