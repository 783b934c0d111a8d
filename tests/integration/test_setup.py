"""``casetrail setup`` makes every component's identity, idempotently, named after the
namespace (so a test stack's never touch a live one's), and ``--remove`` takes them
down again."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import re
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from casetrail.adapters.store import CapabilityKeyRegistry, create_pool
from casetrail.agents.loan_officer import SAMPLE_APPLICATIONS
from casetrail.cli.access import reader_role as reader_role_of
from casetrail.components.sequencer import ledger_state
from casetrail.config import COMPONENTS, DATABASE_COMPONENTS, Settings
from casetrail.errors import PermanentError
from casetrail.ops.setup import remove, remove_broker_users, served_capabilities, setup
from casetrail.trail.keyfile import worker_signer
from tests.support.broker import rabbitmqctl_json
from tests.support.helpers import ended
from tests.support.stack import InProcessStack, module_stack, other_namespace


def _casetrail(settings: Settings, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "casetrail.cli", *args],
                          env=settings.environment(**extra), capture_output=True, text=True,
                          timeout=120, check=False)


async def test_setup_makes_each_identity_once_and_remove_takes_them_down(
    settings: Settings, pool: asyncpg.Pool,
) -> None:
    ns = other_namespace(settings, "setup")
    try:
        first = await asyncio.to_thread(_casetrail, ns, "setup",
                                        CASETRAIL_START_QUEUE_MAX_LENGTH="1234")
        assert first.returncode == 0, first.stderr
        secrets = ns.secrets_path()
        assert stat.S_IMODE(secrets.stat().st_mode) == 0o600
        made = json.loads(secrets.read_text())
        again = await asyncio.to_thread(_casetrail, ns, "setup",
                                        CASETRAIL_START_QUEUE_MAX_LENGTH="1234")
        assert again.returncode == 0, again.stderr
        assert json.loads(secrets.read_text()) == made  # the same passwords: idempotent
        assert set(made) == {"api", "worker", "consumer", "capabilities", "ledger",
                             "auditor", "master_key"} \
            and set(made["auditor"]) == {"database_url"}  # the auditor: no broker user
        assert len(base64.b64decode(made.pop("master_key"))) == 32  # made once, kept
        capabilities = made.pop("capabilities")
        assert set(capabilities) == set(served_capabilities(ns))  # a user each, no database
        # ... and a sealing key each, made once and kept, its public half registered.
        assert all(set(entry) == {"amqp_url", "sealing_key"} for entry in capabilities.values())
        registered = await _registered_capability_keys(ns)
        for name, entry in capabilities.items():
            key = X25519PrivateKey.from_private_bytes(base64.b64decode(entry["sealing_key"]))
            assert registered[name] == key.public_key().public_bytes_raw()

        # Broker: one user per component and per capability, no tags, exactly these
        # permissions.
        users = {u["user"]: u for u in rabbitmqctl_json("list_users")}
        for user in [*map(ns.broker_user, COMPONENTS), *map(ns.capability_user, capabilities)]:
            assert users[user]["tags"] == []
        permissions = {p["user"]: p for p in rabbitmqctl_json("list_permissions")}
        escaped = re.escape(ns.namespace)
        watch = rf"{escaped}\.watch\.[0-9a-f]{{32}}"
        assert permissions[ns.broker_user("api")] == {
            "user": ns.broker_user("api"), "configure": rf"^{watch}$",
            "write": rf"^({escaped}\.(commands|cancel)|{watch})$",
            "read": rf"^({escaped}\.(events|log-head|checkpoints)|{watch})$"}
        assert permissions[ns.broker_user("consumer")]["read"] == rf"^{escaped}\.event-log$"
        # Capability workers: no configure (no spy queue, no queue deleted), no default
        # exchange (it reaches every queue), no exchange to bind from, and each
        # capability's user reads that capability's queue alone.
        assert permissions[ns.capability_user("credit-score")] == {
            "user": ns.capability_user("credit-score"), "configure": "^$",
            "write": rf"^{escaped}\.(replies|dead-letter)$",
            "read": rf"^{escaped}\.capability\.credit\-score$"}
        topics = {(t["user"], t["exchange"]): t for t in rabbitmqctl_json(
            "list_topic_permissions")}
        assert topics[(ns.broker_user("worker"), f"{ns.namespace}.events")]["write"] == r"^case\."
        assert topics[(ns.broker_user("api"), f"{ns.namespace}.events")]["write"] == "^$"
        assert topics[(ns.broker_user("api"), f"{ns.namespace}.events")]["read"] == r"^case\."
        assert topics[(ns.broker_user("consumer"), f"{ns.namespace}.events")]["read"] == "^$"
        assert topics[(ns.broker_user("ledger"), f"{ns.namespace}.events")]["write"] == \
            r"^ledger\."
        policy = {p["name"]: p for p in rabbitmqctl_json("list_policies")}[
            f"{ns.namespace}-case-start-limit"]
        assert json.loads(str(policy["definition"])) == {"max-length": 1234,
                                                        "overflow": "reject-publish"}

        # Postgres: a NOLOGIN owner that owns every table; login roles with no powers.
        roles = {r["rolname"]: r for r in await pool.fetch(
            "SELECT rolname, rolcanlogin, rolsuper, rolcreaterole, rolcreatedb, rolbypassrls "
            "FROM pg_roles WHERE rolname LIKE $1", ns.namespace + "\\_%")}
        assert roles[ns.database_role("owner")]["rolcanlogin"] is False
        for component in DATABASE_COMPONENTS:
            role = roles[ns.database_role(component)]
            assert role["rolcanlogin"] is True
            assert not any(role[a] for a in ("rolsuper", "rolcreaterole", "rolcreatedb",
                                             "rolbypassrls"))
        conn = await asyncpg.connect(ns.database_url)
        try:
            owners = {r["tableowner"] for r in await conn.fetch(
                "SELECT tableowner FROM pg_tables WHERE schemaname = 'public'")}
        finally:
            await conn.close()
        assert owners == {ns.database_role("owner")}

        await _removal_asks_then_leaves_nothing(ns, list(made), pool)
    finally:
        await remove(ns)


async def _removal_asks_then_leaves_nothing(ns: Settings, components: list[str],
                                            pool: asyncpg.Pool) -> None:
    reader = await asyncio.to_thread(_casetrail, ns, "sql-role", "create", "--tenant", "acme")
    assert reader.returncode == 0, reader.stderr
    reader_role = reader_role_of(ns.namespace, "acme")
    assert await pool.fetchval("SELECT count(*) FROM pg_roles WHERE rolname = $1",
                               reader_role) == 1
    kept = await asyncio.to_thread(_casetrail, ns, "setup", "--remove")  # asks first
    assert kept.returncode == 1 and "Remove namespace" in kept.stdout  # no answer: no
    assert ns.secrets_path().exists()
    # The ledger's high-water mark goes with it: left behind, it would halt a namespace
    # made again under the name as "behind" a log that is no more.
    state = ledger_state(ns).path
    state.write_text("{}")
    gone = await asyncio.to_thread(_casetrail, ns, "setup", "--remove", "--yes")
    assert gone.returncode == 0, gone.stderr
    assert not ns.secrets_path().exists()
    assert not state.exists() and f"removed {state}" in gone.stdout, gone.stdout
    assert f"{ns.namespace}-case-start-limit" not in {
        p["name"] for p in rabbitmqctl_json("list_policies")}  # nothing left behind
    assert not ({ns.broker_user(c) for c in components}  # type: ignore[arg-type]
                | {ns.capability_user(c) for c in served_capabilities(ns)}) & {
        u["user"] for u in rabbitmqctl_json("list_users")}
    assert not await pool.fetchval("SELECT count(*) FROM pg_roles WHERE rolname LIKE $1",
                                   ns.namespace + "\\_%")
    assert not await pool.fetchval("SELECT count(*) FROM pg_roles WHERE rolname = $1",
                                   reader_role)  # a tenant's reader login goes too


@pytest.fixture
def management() -> Iterator[tuple[str, list[tuple[str, str | None, Any]]]]:
    """A local server speaking the management API's wire format; records each request."""
    received: list[tuple[str, str | None, Any]] = []

    class Management(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            received.append((self.path, self.headers.get("Authorization"), body))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Management)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://admin:s%40cret@127.0.0.1:{server.server_address[1]}", received
    server.shutdown()


async def test_setup_imports_the_definitions_through_the_management_api(
    settings: Settings, management: tuple[str, list[tuple[str, str | None, Any]]],
) -> None:
    """Where the broker runs elsewhere (docker-compose), the same users, permissions and
    policy go to ``POST /api/definitions``; passwords given in the component URLs (as
    compose passes them) are the ones set."""
    url, received = management
    ns = other_namespace(settings, "mgmt")
    given = f"amqp://{ns.broker_user('worker')}:w0rker-pass@127.0.0.1:5672/"
    # As compose gives them: a capability's URL and its sealing key, in JSON by name.
    credit = f"amqp://{ns.capability_user('credit-score')}:cr3dit-pass@127.0.0.1:5672/"
    sealing_key = X25519PrivateKey.generate()
    sealing_text = base64.b64encode(sealing_key.private_bytes_raw()).decode()
    try:
        done = await asyncio.to_thread(
            _casetrail, ns, "setup", CASETRAIL_RABBITMQ_MANAGEMENT_URL=url,
            CASETRAIL_WORKER_AMQP_URL=given,
            CASETRAIL_CAPABILITY_AMQP_URLS=json.dumps({"credit-score": credit}),
            CASETRAIL_CAPABILITY_SEALING_KEYS=json.dumps({"credit-score": sealing_text}))
        assert done.returncode == 0, done.stderr
        (path, authorization, body), = received
        assert path == "/api/definitions"
        assert authorization == "Basic " + base64.b64encode(b"admin:s@cret").decode()
        assert {u["name"] for u in body["users"]} == {
            *(ns.broker_user(c) for c in ("api", "worker", "consumer", "ledger")),
            *(ns.capability_user(c) for c in served_capabilities(ns))}
        worker = next(u for u in body["users"] if u["name"] == ns.broker_user("worker"))
        salted = base64.b64decode(worker["password_hash"])
        assert salted[4:] == hashlib.sha256(salted[:4] + b"w0rker-pass").digest()
        assert body["policies"][0]["name"] == f"{ns.namespace}-case-start-limit"
        assert json.loads(ns.secrets_path().read_text())["worker"]["amqp_url"] == given
        credit_user = next(u for u in body["users"]
                           if u["name"] == ns.capability_user("credit-score"))
        salted = base64.b64decode(credit_user["password_hash"])
        assert salted[4:] == hashlib.sha256(salted[:4] + b"cr3dit-pass").digest()
        stored = json.loads(ns.secrets_path().read_text())["capabilities"]["credit-score"]
        assert stored == {"amqp_url": credit}  # the given key is not copied anywhere
        registered = await _registered_capability_keys(ns)
        assert registered["credit-score"] == sealing_key.public_key().public_bytes_raw()

        wrong = await asyncio.to_thread(
            _casetrail, ns, "setup", CASETRAIL_RABBITMQ_MANAGEMENT_URL=url,
            CASETRAIL_WORKER_AMQP_URL="amqp://guest:guest@127.0.0.1:5672/")
        assert wrong.returncode == 2
        assert f"must name the user {ns.broker_user('worker')!r}" in wrong.stderr
    finally:
        await remove(ns)


async def _registered_capability_keys(ns: Settings) -> dict[str, bytes]:
    pool = await create_pool(ns.database_url, max_size=1)
    try:
        return await CapabilityKeyRegistry(pool).all()
    finally:
        await pool.close()


def test_a_component_refuses_the_bootstrap_identity(settings: Settings) -> None:
    """Pointing a component at the admin user is refused before it connects."""
    done = _casetrail(settings, "consumer",
                      CASETRAIL_CONSUMER_AMQP_URL="amqp://guest:guest@127.0.0.1:5672/")
    assert done.returncode != 0
    assert f"must connect as {settings.broker_user('consumer')!r}, not 'guest'" in done.stderr


def test_without_setup_a_component_says_what_to_run(settings: Settings, tmp_path: Path) -> None:
    done = _casetrail(settings, "worker", CASETRAIL_SECRETS_FILE=str(tmp_path / "none.json"))
    assert done.returncode != 0
    assert "run `casetrail setup`" in done.stderr


async def test_an_operator_registers_a_key_from_its_public_half(
    settings: Settings, pool: asyncpg.Pool, tmp_path: Path,
) -> None:
    """`signer generate --public-out` then `signer register` of the public file (what
    compose's setup does without the private key); `signer list` shows it."""
    private, public = tmp_path / "w.pem", tmp_path / "w.pub"
    made = await asyncio.to_thread(_casetrail, settings, "signer", "generate", "-o",
                                   str(private), "--public-out", str(public))
    assert made.returncode == 0, made.stderr
    assert public.read_text().strip() == made.stdout.strip()
    key = worker_signer(settings.model_copy(update={"signing_key_file": str(private)}))
    assert not await pool.fetchval("SELECT count(*) FROM signing_keys WHERE key_id = $1",
                                   key.key_id)
    registered = await asyncio.to_thread(_casetrail, settings, "signer", "register",
                                         str(public))
    assert registered.returncode == 0 and f"key {key.key_id} registered" in registered.stdout
    assert await pool.fetchval("SELECT public_key FROM signing_keys WHERE key_id = $1",
                               key.key_id) == key.public_key
    listed = await asyncio.to_thread(_casetrail, settings, "signer", "list")
    assert any(line.startswith(key.key_id) for line in listed.stdout.splitlines())
    junk = tmp_path / "junk"
    junk.write_text("not a key")
    refused = await asyncio.to_thread(_casetrail, settings, "signer", "register", str(junk))
    assert refused.returncode == 2 and "neither a signing key nor a public key" in refused.stderr



stack = module_stack(worker_concurrency=2)


def test_each_namespace_gets_a_database_of_its_own_by_default() -> None:
    assert Settings(namespace="ops-a").database_url.endswith("/ops-a")
    assert Settings(namespace="ops-b").database_url.endswith("/ops-b")
    assert Settings(namespace="ops-b", database_url="postgresql://h/shared").database_url \
        == "postgresql://h/shared"  # set explicitly, it is used as given


async def test_another_namespace_neither_takes_over_nor_removes_this_ones_database(
    settings: Settings, stack: InProcessStack, client: httpx.AsyncClient,
    pool: asyncpg.Pool,
) -> None:
    """The attack: namespace B pointed at A's database. B's setup used to take A's tables
    over (and die half-way); B's removal force-dropped A's database with its signed
    events. Both are refused, before anything is touched, and A's trail still verifies."""
    case_id = (await client.post("/cases", json={"agent": "loan-officer",
                                                  "input": SAMPLE_APPLICATIONS[0]})
               ).json()["caseId"]
    await ended(client, case_id)
    intruder = other_namespace(settings, "intruder").model_copy(
        update={"database_url": settings.database_url})
    try:
        with pytest.raises(PermanentError, match="holds objects of another namespace"):
            await setup(intruder)
        made = await pool.fetchval("SELECT count(*) FROM pg_roles WHERE rolname LIKE $1",
                                   f"{intruder.namespace}%")
        assert made == 0  # refused before anything was created
        with pytest.raises(PermanentError, match="holds objects of another namespace"):
            await remove(intruder)
        refused = await asyncio.to_thread(_casetrail, intruder, "setup", "--remove", "--yes")
        assert refused.returncode == 2 and "another namespace" in refused.stderr
    finally:
        remove_broker_users(intruder)
        intruder.secrets_path().unlink(missing_ok=True)
    owners = {r["tableowner"] for r in await pool.fetch(
        "SELECT tableowner FROM pg_tables WHERE schemaname = 'public'")}
    assert owners == {settings.database_role("owner")}
    report = (await client.get(f"/cases/{case_id}/verify")).json()
    assert report["verified"] and report["complete"], report
    again = (await client.post("/cases", json={"agent": "loan-officer",
                                                "input": SAMPLE_APPLICATIONS[2]})).json()
    assert (await ended(client, again["caseId"]))["status"] == "completed"


async def test_the_command_line_says_its_version_and_not_found_is_exit_2(
    settings: Settings, pool: asyncpg.Pool,
) -> None:
    from importlib.metadata import version

    shown = await asyncio.to_thread(_casetrail, settings, "--version")
    assert shown.returncode == 0 and shown.stdout.strip() == f"casetrail {version('casetrail')}"
    unknown = "00000000-0000-4000-8000-000000000000"
    for command in ("trail", "verify", "export"):
        extra = ("-o", "/dev/null") if command == "export" else ()
        reply = await asyncio.to_thread(_casetrail, settings, command, unknown, *extra)
        assert reply.returncode == 2, (command, reply.stdout, reply.stderr)


async def test_setup_replaces_a_capability_queue_of_the_old_shape(
    settings: Settings, amqp: Any,
) -> None:
    """Capability queues used to dead-letter expired requests (with their arguments in
    clear); setup now declares them without a dead-letter exchange, and replaces a queue
    of the old shape (it holds only requests whose callers time out)."""
    import aio_pika
    import aiormq

    from casetrail.adapters.bus.topology import CAPABILITY_DELIVERY_LIMIT, Topology

    topology = Topology(settings.namespace)
    name = topology.capability_queue("old-shape")
    channel = await amqp.channel()
    await channel.declare_queue(name, durable=True, arguments={
        "x-queue-type": "quorum", "x-delivery-limit": CAPABILITY_DELIVERY_LIMIT,
        "x-dead-letter-exchange": topology.dead_letter_exchange})
    await channel.close()
    fresh = await amqp.channel()
    await topology.declare_capability_queue(fresh, "old-shape")
    await fresh.close()
    check = await amqp.channel()
    raw = await check.get_underlay_channel()
    try:  # the new shape is declared as is: no precondition fails
        await raw.queue_declare(name, durable=True, arguments=topology.capability_arguments())
    except aiormq.exceptions.ChannelPreconditionFailed as exc:
        raise AssertionError(f"the old queue was kept: {exc}") from None
    await raw.queue_delete(name, if_unused=False, if_empty=False)
    await check.close()
    assert isinstance(amqp, aio_pika.abc.AbstractRobustConnection)
