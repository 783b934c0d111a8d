"""Sensitive input fields (real broker, real Postgres, real uvicorn): kept out of the
stored input, the trail and the bus; shown in clear only to ``pii:read`` callers, each
such read logged; erased by shredding the case's key, after which the trail still
verifies and nothing anywhere turns a placeholder back into its value."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import aio_pika
import asyncpg
import httpx
import orjson
import pytest

from casetrail.adapters.bus.publisher import Publisher
from casetrail.adapters.bus.topology import Topology
from casetrail.agents.loan_officer import SAMPLE_APPLICATIONS
from casetrail.contract.commands import EraseCommand
from casetrail.contract.events import (
    CaseCompletedPayload,
    SignedPersonAction,
    TokenUsage,
    make_event,
)
from casetrail.contract.integrity import canonical
from casetrail.errors import PermanentError
from casetrail.privacy.sensitive import Redaction, Vault
from casetrail.trail.keyfile import action_signer
from casetrail.trail.person_actions import erase_object, sign_object
from tests.support.cli import STANDALONE_VERIFIER
from tests.support.events import cycle
from tests.support.helpers import dead_letter_for, ended, wait_for_sql
from tests.support.records import SUSPECT, key_with
from tests.support.stack import InProcessStack, module_stack

stack = module_stack(worker_concurrency=4)

LOAN = SAMPLE_APPLICATIONS[0]  # Maria Okafor
NAME = LOAN["applicantName"]




@pytest.fixture(scope="module")
async def auditor(stack: InProcessStack, pool: asyncpg.Pool
                  ) -> AsyncIterator[httpx.AsyncClient]:
    """A caller who may see the values in clear."""
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=10,
                                 headers=await key_with(pool, "cases:read", "pii:read")) as c:
        yield c


@pytest.fixture(scope="module")
async def admin(stack: InProcessStack, pool: asyncpg.Pool) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=10,
                                 headers=await key_with(pool, "admin")) as c:
        yield c


async def bodies(pool: asyncpg.Pool, case_id: str) -> str:
    rows = await pool.fetch("SELECT body, payload::text AS payload FROM event_log "
                            "WHERE case_id = $1", uuid.UUID(case_id))
    return " ".join(bytes(r["body"]).decode() + r["payload"] for r in rows)


async def test_a_marked_value_is_nowhere_in_the_record_or_on_the_bus(
    client: httpx.AsyncClient, pool: asyncpg.Pool, amqp: aio_pika.abc.AbstractRobustConnection,
    settings: Any,
) -> None:
    channel = await amqp.channel()
    events = await channel.get_exchange(f"{settings.namespace}.events", ensure=False)
    tap = await channel.declare_queue(exclusive=True, auto_delete=True)
    await tap.bind(events, routing_key="case.#")
    case_id = (await client.post("/cases", json={"agent": "loan-officer", "input": LOAN})
               ).json()["caseId"]
    view = await ended(client, case_id)
    assert view["answer"]["decision"] == "approve"  # the case ran on the real input
    assert view["input"]["applicantName"] == "[pii:applicantName]"
    assert view["sensitive"] == {"placeholders": ["[pii:applicantName]"],
                                 "shownInClear": False, "erasedAt": None, "erasedBy": None}
    stored = await pool.fetchval("SELECT input::text FROM cases WHERE case_id = $1",
                                 uuid.UUID(case_id))
    assert NAME not in stored
    trail = await bodies(pool, case_id)
    assert NAME not in trail
    assert "from [pii:applicantName]" in trail  # the reasoning named her: replaced
    seen = []
    while (message := await tap.get(fail=False, no_ack=True)) is not None:
        seen.append(message.body.decode())
    mine = [body for body in seen if case_id in body]
    assert mine and not [body for body in mine if NAME in body]
    await channel.close()
    assert (await client.get(f"/cases/{case_id}/verify")).json()["verified"] is True


async def test_pii_read_sees_the_values_and_each_read_is_logged(
    client: httpx.AsyncClient, auditor: httpx.AsyncClient, pool: asyncpg.Pool,
) -> None:
    case_id = (await client.post("/cases", json={"agent": "loan-officer", "input": LOAN})
               ).json()["caseId"]
    await ended(client, case_id)
    view = (await auditor.get(f"/cases/{case_id}")).json()
    assert view["input"]["applicantName"] == NAME and view["sensitive"]["shownInClear"]
    trail = (await auditor.get(f"/cases/{case_id}/events")).json()["events"]
    assert f"from {NAME}" in trail[1]["payload"]["reasoningText"]
    plain = (await client.get(f"/cases/{case_id}/events")).json()["events"]
    assert NAME not in orjson.dumps(plain).decode()
    logged = await pool.fetch("SELECT principal, action FROM access_log WHERE case_id = $1",
                              uuid.UUID(case_id))
    assert [r["action"] for r in logged] == ["pii:read", "pii:read"]
    assert all(r["principal"].startswith("key:") for r in logged)
    await client.get(f"/cases/{case_id}/bundle")
    assert await pool.fetchval("SELECT count(*) FROM access_log WHERE case_id = $1 AND "
                               "action = 'export'", uuid.UUID(case_id)) == 1


async def test_the_tools_see_the_value_the_trail_only_its_placeholder(
    client: httpx.AsyncClient, pool: asyncpg.Pool, amqp: aio_pika.abc.AbstractRobustConnection,
    settings: Any,
) -> None:
    """The sanctions screening matched the real name (a watchlist hit), while its
    recorded arguments hold the placeholders, and its request on the bus held the name
    only sealed to the sanctions capability's key (a tap on the requests sees neither
    the name nor the customer id)."""
    channel = await amqp.channel()
    requests = await channel.get_exchange(f"{settings.namespace}.capabilities", ensure=False)
    tap = await channel.declare_queue(exclusive=True, auto_delete=True)
    await tap.bind(requests, routing_key="sanctions-screening")
    case_id = (await client.post("/cases", json={"agent": "aml-screening", "input": SUSPECT})
               ).json()["caseId"]
    view = await ended(client, case_id)
    seen = []
    while (message := await tap.get(fail=False, no_ack=True)) is not None:
        seen.append(message.body)
    await channel.close()
    assert seen and all(b"Ivan Petrov" not in body and b"C-4711" not in body for body in seen)
    assert all(orjson.loads(body)["sealed"] for body in seen)
    assert view["answer"]["decision"] in ("escalate", "file-sar")
    args = await pool.fetchval(
        "SELECT tool_args::text FROM react_tool_calls WHERE case_id = $1 AND "
        "tool_name = 'sanctions-screening'", uuid.UUID(case_id))
    assert "[pii:customerName]" in args and "Ivan Petrov" not in args
    trail = await bodies(pool, case_id)
    assert "Ivan Petrov" not in trail and "C-4711" not in trail


async def test_erasure_shreds_the_key_keeps_the_trail_verified_and_is_recorded(
    client: httpx.AsyncClient, auditor: httpx.AsyncClient, admin: httpx.AsyncClient,
    pool: asyncpg.Pool,
) -> None:
    case_id = (await client.post("/cases", json={"agent": "loan-officer", "input": LOAN})
               ).json()["caseId"]
    await ended(client, case_id)
    assert (await client.post(f"/cases/{case_id}/erase")).status_code == 403  # admin only
    erased = await admin.post(f"/cases/{case_id}/erase")
    assert erased.status_code == 202 and erased.json()["status"] == "erased", erased.text
    await wait_for_sql(pool, "SELECT count(*) FROM event_log WHERE case_id = $1 AND "
                             "event_type = 'CASE_ERASED'", uuid.UUID(case_id))
    last = await pool.fetchrow(
        "SELECT event_type, payload FROM event_log WHERE case_id = $1 "
        "ORDER BY attempt DESC, seq DESC LIMIT 1", uuid.UUID(case_id))
    assert last is not None and last["event_type"] == "CASE_ERASED"
    assert last["payload"]["placeholders"] == ["[pii:applicantName]"]
    assert last["payload"]["erasedBy"].startswith("key:")
    report = (await client.get(f"/cases/{case_id}/verify")).json()
    assert report["verified"] is True and report["complete"] is True, report
    view = (await auditor.get(f"/cases/{case_id}")).json()
    assert view["input"]["applicantName"] == "[pii:applicantName]"  # nothing to restore
    assert view["sensitive"]["shownInClear"] is False and view["sensitive"]["erasedBy"]
    assert view["status"] == "completed"
    # No table holds the value, nor the key that could have opened it.
    secret = await pool.fetchrow("SELECT * FROM case_secrets WHERE case_id = $1",
                                 uuid.UUID(case_id))
    assert secret is not None and secret["wrapped_key"] is None and secret["ciphertext"] is None
    for table in ("cases", "event_log", "case_secrets", "access_log"):
        dump = await pool.fetchval(f"SELECT string_agg(t::text, ' ') FROM {table} t "
                                   "WHERE case_id = $1", uuid.UUID(case_id))
        assert NAME not in (dump or ""), table
        assert NAME.encode().hex() not in (dump or ""), table  # nor in a bytea column
    again = await admin.post(f"/cases/{case_id}/erase")
    assert again.status_code == 202 and again.json()["status"] == "already erased"
    assert await pool.fetchval("SELECT count(*) FROM event_log WHERE case_id = $1 AND "
                               "event_type = 'CASE_ERASED'", uuid.UUID(case_id)) == 1


async def test_a_running_case_or_one_without_values_is_not_erased(
    client: httpx.AsyncClient, admin: httpx.AsyncClient,
) -> None:
    slow = {"agent": "loan-officer", "input": LOAN,
            "model": {"provider": "scripted", "name": "slow", "latencyMs": 500}}
    running = (await client.post("/cases", json=slow)).json()["caseId"]
    reply = await admin.post(f"/cases/{running}/erase")
    assert reply.status_code == 409 and "once it has ended" in reply.text
    await ended(client, running)


def test_redaction_replaces_inside_strings_never_in_the_structure() -> None:
    redaction = Redaction.of({"[pii:a]": "0", "[pii:b]": "Maria Okafor",
                              "[pii:c]": 'Say "hi"'})
    body = orjson.dumps({"n": 0, "s": "0", "t": "Hi Maria Okafor, 10", "q": 'Say "hi"',
                         "Maria Okafor": 1}, option=orjson.OPT_SORT_KEYS)
    out = orjson.loads(redaction.apply(body))
    assert out == {"n": 0, "s": "[pii:a]", "t": "Hi [pii:b], 10", "q": "[pii:c]",
                   "[pii:b]": 1}
    untouched = b'{"x":"nothing here"}'
    assert redaction.apply(untouched) is untouched


def test_values_replaced_before_serializing_give_the_same_signed_bytes() -> None:
    """The worker replaces the values in the event's JSON values and serializes once;
    the bytes are those of replacing them in the canonical bytes and serializing again."""
    redaction = Redaction.of({"[pii:a]": "Maria Okafor", "[pii:b]": "A-1001",
                              "[pii:c]": 'Zoë "Z" \\ Ünal'})
    event = make_event(uuid.uuid4(), 1, 0, CaseCompletedPayload(
        cycles_completed=2, token_totals=TokenUsage(input_tokens=3, output_tokens=4),
        answer={"decision": "approve", "ratio": 0.2333, "count": 2**53, "note":
                'Maria Okafor (A-1001) and Zoë "Z" \\ Ünal', "A-1001": [1.5e-7, 1e21]}))
    once = canonical(redaction.replace_in(event.wire_values()))
    assert once == redaction.apply(event.to_json())
    assert b"Maria" not in once and b"[pii:a] ([pii:b])" in once
    plain = make_event(uuid.uuid4(), 1, 0, CaseCompletedPayload(
        cycles_completed=0, token_totals=TokenUsage(input_tokens=0, output_tokens=0),
        answer={"decision": "refer"}))
    assert canonical(redaction.replace_in(plain.wire_values())) == plain.to_json()
    # Beyond 2**53 an integer is written as the double it rounds to, once: serializing
    # twice (as before) turned that double's digits into a string, in events holding
    # values only.
    huge = make_event(uuid.uuid4(), 1, 0, CaseCompletedPayload(
        cycles_completed=0, token_totals=TokenUsage(input_tokens=0, output_tokens=0),
        answer={"big": 2**60, "who": "Maria Okafor"}))
    assert b'"big":1152921504606847000' in canonical(redaction.replace_in(huge.wire_values()))
    assert b'"big":1152921504606847000' in huge.to_json()


def test_sealed_values_open_only_for_their_case_with_their_master_key() -> None:
    vault, other = Vault.from_text(Vault.generate_text()), Vault.from_text(Vault.generate_text())
    case_id = uuid.uuid4()
    sealed = vault.seal(case_id, {"[pii:a]": "secret"})
    assert vault.open(case_id, sealed) == {"[pii:a]": "secret"}
    assert b"secret" not in sealed.ciphertext + sealed.wrapped_key
    with pytest.raises(PermanentError, match="do not open"):
        vault.open(uuid.uuid4(), sealed)
    with pytest.raises(PermanentError, match="sealed with master key"):
        other.open(case_id, sealed)


async def test_casetrail_erase_does_the_same_from_the_command_line(
    client: httpx.AsyncClient, pool: asyncpg.Pool, settings: Any,
) -> None:
    import asyncio
    import subprocess
    import sys

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "casetrail.cli", *args],
                              env=settings.environment(), capture_output=True, text=True,
                              timeout=60, check=False)

    case_id = (await client.post("/cases", json={"agent": "loan-officer", "input": LOAN})
               ).json()["caseId"]
    await ended(client, case_id)
    done = await asyncio.to_thread(cli, "erase", case_id)
    assert done.returncode == 0 and done.stdout.startswith("erased at"), done.stderr
    await wait_for_sql(pool, "SELECT count(*) FROM event_log WHERE case_id = $1 AND "
                             "event_type = 'CASE_ERASED'", uuid.UUID(case_id))
    assert await pool.fetchval("SELECT principal FROM access_log WHERE case_id = $1 AND "
                               "action = 'erase'", uuid.UUID(case_id)) == "operator"
    assert (await asyncio.to_thread(cli, "erase", case_id)).stdout.startswith("already")
    assert (await asyncio.to_thread(cli, "erase", str(uuid.uuid4()))).returncode == 2
    exported = await asyncio.to_thread(cli, "export", case_id, "-o", "/dev/null")
    assert exported.returncode == 0, exported.stderr
    assert await pool.fetchval("SELECT count(*) FROM access_log WHERE case_id = $1 AND "
                               "action = 'export' AND principal = 'operator'",
                               uuid.UUID(case_id)) == 1


async def test_an_erased_case_bundle_verifies_offline(
    client: httpx.AsyncClient, admin: httpx.AsyncClient, pool: asyncpg.Pool, settings: Any,
    signer: Any, tmp_path: Any,
) -> None:
    """Both verifiers (casetrail's and the standalone one of docs/bundle.md) accept the
    CASE_ERASED after the terminal event, and refuse any other event there."""
    import asyncio
    import subprocess
    import sys

    from casetrail.contract.integrity import public_key_text

    case_id = (await client.post("/cases", json={"agent": "loan-officer", "input": LOAN})
               ).json()["caseId"]
    await ended(client, case_id)
    assert (await admin.post(f"/cases/{case_id}/erase")).status_code == 202
    await wait_for_sql(pool, "SELECT count(*) FROM event_log WHERE case_id = $1 AND "
                             "event_type = 'CASE_ERASED'", uuid.UUID(case_id))
    bundle = (await client.get(f"/cases/{case_id}/bundle")).json()
    last = bundle["events"][-1]
    assert orjson.loads(last["body"])["eventType"] == "CASE_ERASED"
    good = tmp_path / "erased.json"
    good.write_bytes(orjson.dumps(bundle))
    # A holder of the worker's key appends a cycle after the end: chained and signed,
    # and still refused, as an event other than an erasure after the terminal one.
    extra = cycle(uuid.UUID(case_id), last["seq"] + 1, 9)
    body = extra.to_json()
    sealed = signer.seal(last["integrity"]["hash"], body)
    bad = tmp_path / "appended.json"
    bad.write_bytes(orjson.dumps({**bundle, "events": [
        *bundle["events"], {"attempt": 1, "seq": last["seq"] + 1, "body": body.decode(),
                            "integrity": sealed.as_json()}]}))
    trusted = public_key_text(signer.public_key)
    standalone = STANDALONE_VERIFIER
    for command in ([sys.executable, "-m", "casetrail.cli", "verify-bundle"],
                    [sys.executable, str(standalone)]):
        ok, refused = [await asyncio.to_thread(
            subprocess.run, [*command, str(path), "--trust", trusted], env=settings.environment(),
            capture_output=True, text=True, check=False) for path in (good, bad)]
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert "after_terminal" in refused.stdout + refused.stderr


def test_the_request_digest_is_keyed_by_the_master_key() -> None:
    """The idempotency check's digest of a request holding a name cannot be used to test
    guesses of that name without the master key."""
    import hashlib

    vault, other = Vault.from_text(Vault.generate_text()), Vault.from_text(Vault.generate_text())
    request = orjson.dumps({"input": {"applicantName": NAME}})
    assert vault.request_digest(request) == vault.request_digest(request)
    assert vault.request_digest(request) != other.request_digest(request)
    assert vault.request_digest(request) != hashlib.sha256(request).hexdigest()


async def test_values_sealed_under_another_master_key_stay_placeholders(
    client: httpx.AsyncClient, auditor: httpx.AsyncClient, pool: asyncpg.Pool,
) -> None:
    """A master key rotated away without re-sealing: the case still reads, as
    placeholders, and nothing is logged as read."""
    case_id = (await client.post("/cases", json={"agent": "loan-officer", "input": LOAN})
               ).json()["caseId"]
    await ended(client, case_id)
    stranger = Vault.from_text(Vault.generate_text()).seal(uuid.UUID(case_id),
                                                            {"[pii:applicantName]": "X"})
    await pool.execute("UPDATE case_secrets SET master_key_id = $2, wrapped_key = $3, "
                       "ciphertext = $4 WHERE case_id = $1", uuid.UUID(case_id),
                       stranger.master_key_id, stranger.wrapped_key, stranger.ciphertext)
    reply = await auditor.get(f"/cases/{case_id}")
    assert reply.status_code == 200
    assert reply.json()["input"]["applicantName"] == "[pii:applicantName]"
    assert reply.json()["sensitive"]["shownInClear"] is False
    assert not await pool.fetchval("SELECT count(*) FROM access_log WHERE case_id = $1",
                                   uuid.UUID(case_id))


async def test_case_erased_carries_the_trails_tenant_not_the_commands(
    client: httpx.AsyncClient, pool: asyncpg.Pool, settings: Any,
    stack: InProcessStack, amqp: aio_pika.abc.AbstractRobustConnection, topology: Topology,
) -> None:
    """An erase command sent with the API's broker identity alone (no signed erasure)
    erases nothing and is set aside; one that names another tenant beside a genuine
    signed erasure does not move the case's CASE_ERASED into that tenant's events. The
    values go only when that CASE_ERASED is stored."""
    case_id = uuid.UUID((await client.post("/cases", json={"agent": "loan-officer",
                                                            "input": LOAN})).json()["caseId"])
    await ended(client, case_id)
    signed = sign_object(action_signer(settings), erase_object(
        case_id, "default", "key:test", datetime.now(UTC)))
    connection = await aio_pika.connect(settings.identity("api").amqp_url)
    try:
        publisher = await Publisher.open(connection)  # type: ignore[arg-type]
        for action, message_id in ((None, f"forged-erase-{case_id}"), (
                SignedPersonAction.model_validate(signed.as_json()), f"erase-{case_id}")):
            await publisher.publish(
                f"{settings.namespace}.commands", Topology.ERASE_KEY,
                EraseCommand(case_id=case_id, tenant_id="intruder", action=action).to_json(),
                message_type=EraseCommand.MESSAGE_TYPE, message_id=message_id)
            if action is None:
                reason = await dead_letter_for(amqp, topology, message_id)
                assert "no action key signed the erasure" in reason, reason
                assert await pool.fetchval("SELECT wrapped_key IS NOT NULL FROM case_secrets "
                                           "WHERE case_id = $1", case_id) is True
    finally:
        await connection.close()
    await wait_for_sql(pool, "SELECT count(*) FROM event_log WHERE case_id = $1 AND "
                             "event_type = 'CASE_ERASED'", case_id)
    tenants = await pool.fetch("SELECT DISTINCT tenant_id FROM event_log WHERE case_id = $1",
                               case_id)
    assert [r["tenant_id"] for r in tenants] == ["default"]
    secret = await pool.fetchrow("SELECT erased_by, wrapped_key FROM case_secrets "
                                 "WHERE case_id = $1", case_id)
    assert secret is not None and (secret["erased_by"], secret["wrapped_key"]) == (
        "key:test", None)
    report = (await client.get(f"/cases/{case_id}/verify")).json()
    assert report["verified"] is True, report
