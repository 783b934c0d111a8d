"""``casetrail setup``: every component's own identity, and what the broker needs that
AMQP cannot declare, set up idempotently with the bootstrap (admin) URLs.

- **Postgres**: a NOLOGIN owner role owns the schema (the migrations run as it); the
  api, worker and consumer log in as roles of their own with the grants each needs
  and nothing else (``GRANTS``). The consumer alone inserts into ``event_log`` and
  nobody may update or delete it; the API cannot write it.
- **RabbitMQ**: a user per component whose configure/write/read regexes allow exactly
  what it does (``broker_definitions``), and topic permissions on ``<ns>.events`` so
  that only the worker publishes ``case.*``. Users, permissions and the start queue's
  length policy go to the broker as one *definitions* document: ``rabbitmqctl
  import_definitions`` on this machine, or ``POST /api/definitions`` of the management
  API (``CASETRAIL_RABBITMQ_MANAGEMENT_URL``, e.g. in docker-compose). Then the
  topology is declared as the admin, since no component may declare shared queues.
- Every name carries the namespace, so a test stack and a live one never share an
  identity. Passwords come from the component URLs when the environment sets them
  (docker-compose passes them in), else from the secrets file of an earlier run,
  else they are generated; the secrets file (mode 0600) then holds each component's
  URLs, and components read their own from it when no ``CASETRAIL_<C>_*_URL`` is set.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import aiormq
import httpx
from tenacity import AsyncRetrying, retry_if_exception, stop_after_delay, wait_fixed

from casetrail.adapters.bus.connection import connect
from casetrail.adapters.bus.topology import Topology
from casetrail.adapters.store import CapabilityKeyRegistry, KeyRegistry, create_pool
from casetrail.adapters.store.keys import KeyTable
from casetrail.adapters.store.namespace import (
    check_not_others,
    check_removable,
    remove_database,
    setup_database,
    subscriber_names,
)
from casetrail.agents import CAPABILITIES
from casetrail.audit.audit_runs import state_file_for as audit_state_file
from casetrail.config import (
    COMPONENTS,
    DATABASE_COMPONENTS,
    Component,
    Settings,
    amqp_nodes,
    local_file,
)
from casetrail.contract.integrity import key_id
from casetrail.engine.tools import a2a_capability, mcp_capability
from casetrail.errors import PermanentError
from casetrail.ledger.high_water import state_file_for
from casetrail.ops import retention_journal, revocations
from casetrail.ops.keys_on_hand import refuse_new_keys
from casetrail.ops.waiting import wait_for_services
from casetrail.privacy import sealing
from casetrail.privacy.sensitive import Vault
from casetrail.trail.key_source import is_file
from casetrail.trail.keyfile import (
    audit_key_spec,
    local_audit_key,
    read_public_key,
    signer_from,
)
from casetrail.trail.verification import PublicKey

log = logging.getLogger("casetrail.setup")


# -- identities ------------------------------------------------------------------------

def _with_user(url: str, user: str, password: str) -> str:
    """``url`` (each URL of a comma-separated list: a cluster's nodes) as ``user``."""
    def one(node: str) -> str:
        parts = urlsplit(node)
        host = parts.netloc.rpartition("@")[2]
        return urlunsplit(parts._replace(netloc=f"{quote(user, safe='')}:"
                                                f"{quote(password, safe='')}@{host}"))

    return ",".join(one(node) for node in amqp_nodes(url))


def _given_password(url: str | None, expected_user: str, variable: str) -> str | None:
    """The password of a component URL the environment sets, checked to name the user
    setup creates."""
    if url is None:
        return None
    parts = urlsplit(amqp_nodes(url)[0])
    if unquote(parts.username or "") != expected_user or not parts.password:
        raise PermanentError(f"{variable} must name the user {expected_user!r} with a password "
                             "(setup creates that identity with it)")
    return unquote(parts.password)


def served_capabilities(settings: Settings) -> list[str]:
    """Every capability setup gives a queue and a broker user: the installed agents',
    one per configured MCP server (``mcp-<name>``) and remote A2A agent (``a2a-<name>``)
    and the operator's ``extra_capabilities``."""
    return sorted({*CAPABILITIES, *(mcp_capability(s.name) for s in settings.mcp_servers),
                   *(a2a_capability(a.name) for a in settings.a2a_agents),
                   *settings.extra_capabilities})


def _password_of(url: str) -> str:
    return unquote(urlsplit(amqp_nodes(url)[0]).password or "")


@dataclass(frozen=True)
class Identities:
    """The URLs every component connects with, as setup made them (each capability's
    broker URL by its name), and the master key (kept here only when the environment
    does not set one)."""

    urls: dict[Component, dict[str, str]]
    capabilities: dict[str, str]
    sealing_keys: dict[str, str]
    """Each capability's private sealing key, kept here only where the environment
    does not set it."""
    master_key: str | None = None

    def password(self, component: Component, kind: str) -> str:
        return _password_of(self.urls[component][kind])


def plan_identities(settings: Settings) -> Identities:
    """Each component's URLs: given in the environment, kept from an earlier run, or new."""
    stored = settings.stored_secrets()
    urls: dict[Component, dict[str, str]] = {}
    for component in dict.fromkeys((*COMPONENTS, *DATABASE_COMPONENTS)):
        kept = stored.get(component, {})
        kinds = [("amqp_url", settings.amqp_url, settings.broker_user(component))] \
            if component in COMPONENTS else []
        if component in DATABASE_COMPONENTS:
            kinds.append(("database_url", settings.database_url,
                          settings.database_role(component)))
        entry = {}
        for kind, bootstrap, user in kinds:
            given = getattr(settings, f"{component}_{kind}")
            password = (_given_password(given, user, f"CASETRAIL_{component.upper()}_"
                                                     f"{kind.upper()}")
                        or _kept_password(kept.get(kind), user)
                        or secrets.token_urlsafe(24))
            entry[kind] = given or _with_user(bootstrap, user, password)
        urls[component] = entry
    capabilities, sealing_keys = {}, {}
    kept_capabilities = stored.get("capabilities", {})
    for name in served_capabilities(settings):
        if name not in settings.capability_sealing_keys:
            sealing_keys[name] = (kept_capabilities.get(name, {}).get("sealing_key")
                                  or sealing.generate_text())
        user, given = settings.capability_user(name), settings.capability_amqp_urls.get(name)
        password = (_given_password(given, user, f"CASETRAIL_CAPABILITY_AMQP_URLS[{name!r}]")
                    or _kept_password(kept_capabilities.get(name, {}).get("amqp_url"), user)
                    or secrets.token_urlsafe(24))
        capabilities[name] = given or _with_user(settings.amqp_url, user, password)
    master = None if settings.master_key is not None else (
        stored.get("master_key") or Vault.generate_text())
    return Identities(urls, capabilities, sealing_keys, master)


def _kept_password(url: str | None, user: str) -> str | None:
    first = urlsplit(amqp_nodes(url)[0]) if url is not None else None
    if first is None or unquote(first.username or "") != user:
        return None
    return unquote(first.password or "") or None


def write_secrets(path: Path, identities: Identities) -> None:
    """The secrets file: readable by its owner only, replaced atomically."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=".identities-")
    contents: dict[str, Any] = {str(k): v for k, v in identities.urls.items()}
    contents["capabilities"] = {
        name: {"amqp_url": url} | ({"sealing_key": identities.sealing_keys[name]}
                                   if name in identities.sealing_keys else {})
        for name, url in identities.capabilities.items()}
    if identities.master_key is not None:
        contents["master_key"] = identities.master_key
    with os.fdopen(descriptor, "w") as handle:  # mkstemp makes it 0600
        json.dump(contents, handle, indent=2)
    os.replace(temporary, path)


# -- RabbitMQ ----------------------------------------------------------------------------

def password_hash(password: str) -> str:
    """RabbitMQ's stored form of a password (rabbit_password_hashing_sha256): base64 of a
    4-byte salt followed by SHA-256(salt ‖ password)."""
    salt = secrets.token_bytes(4)
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode()).digest()).decode()


def start_limit_policy(settings: Settings) -> str:
    """The name of the namespace's start-queue length policy."""
    return f"{settings.namespace}-case-start-limit"


def broker_permissions(settings: Settings) -> dict[str, tuple[str, str, str]]:
    """``(configure, write, read)`` regexes per broker user. Binding a queue needs write
    on the queue and read on the exchange; publishing needs write on the exchange."""
    ns = re.escape(settings.namespace)
    private = rf"{ns}\.(cancel|reply)\.[0-9a-f]{{32}}"  # the worker's exclusive queues
    watch = rf"{ns}\.watch\.[0-9a-f]{{32}}"  # the API's exclusive queue for its streams
    user = settings.broker_user
    permissions = {
        # Start commands and cancel broadcasts; its own queue of live events for the
        # streams, bound to <ns>.events (binding needs read on the exchange); the
        # streams of checkpoints, to know when the log stops vouching
        # (casetrail.api.log_watch).
        user("api"): (rf"^{watch}$", rf"^({ns}\.(commands|cancel)|{watch})$",
                      rf"^({ns}\.(events|log-head|checkpoints)|{watch})$"),
        # Takes start commands, hears cancels, publishes events and tool requests,
        # reads tool replies on its own queue; sets aside what it cannot process;
        # re-sends the start command of a stranded case (service/components/sweeper.py).
        user("worker"): (rf"^{private}$",
                         rf"^({ns}\.(events|commands|capabilities|dead-letter)|{private})$",
                         rf"^({ns}\.(case-start|cancel|replies|retention-journal)|{private})$"),
        # Reads the event log queue; sets aside what it refuses.
        user("consumer"): ("^$", rf"^{ns}\.dead-letter$", rf"^{ns}\.event-log$"),
        # Publishes signed checkpoints on <ns>.events (ledger.checkpoint); reads the
        # newest back at start, its high-water mark (casetrail.ledger.high_water).
        user("ledger"): ("^$", rf"^{ns}\.events$", rf"^{ns}\.(log-head|checkpoints)$"),
    }
    for capability in served_capabilities(settings):
        # Each capability's user reads its own queue, which setup declared, and no other
        # (declares, binds and deletes nothing, so it cannot bind a spy queue to another
        # capability's requests); replies through <ns>.replies, never the default
        # exchange, which reaches every queue (the worker takes a reply only from the
        # user of the capability it called).
        permissions[settings.capability_user(capability)] = (
            "^$", rf"^{ns}\.(replies|dead-letter)$",
            rf"^{ns}\.capability\.{re.escape(capability)}$")
    return permissions


def broker_definitions(settings: Settings, identities: Identities) -> dict[str, Any]:
    """Users, permissions, topic permissions and policies, as one definitions document
    (the format of ``rabbitmqctl import_definitions`` and ``POST /api/definitions``)."""
    vhost = settings.amqp_vhost()
    topology = Topology(settings.namespace)
    passwords = {settings.broker_user(c): identities.password(c, "amqp_url")
                 for c in COMPONENTS}
    passwords |= {settings.capability_user(name): _password_of(url)
                  for name, url in identities.capabilities.items()}
    # Only the worker publishes case events and the ledger checkpoints; only the API
    # binds to case events (for its streams); other subscribers get users of their own.
    topic_write = {settings.broker_user("worker"): r"^case\.",
                   settings.broker_user("ledger"): r"^ledger\."}
    users, permissions, topics = [], [], []
    for user, (configure, write, read) in broker_permissions(settings).items():
        users.append({"name": user, "tags": "",
                      "password_hash": password_hash(passwords[user]),
                      "hashing_algorithm": "rabbit_password_hashing_sha256"})
        permissions.append({"user": user, "vhost": vhost, "configure": configure,
                            "write": write, "read": read})
        topics.append({"user": user, "vhost": vhost, "exchange": topology.events_exchange,
                       "write": topic_write.get(user, "^$"),
                       "read": r"^case\." if user == settings.broker_user("api") else "^$"})
    policies = [{"vhost": vhost, "name": start_limit_policy(settings),
                 "pattern": f"^{re.escape(topology.case_start_queue)}$", "apply-to": "queues",
                 "priority": 0,
                 "definition": {"max-length": settings.start_queue_max_length,
                                "overflow": "reject-publish"}}]
    return {"users": users, "permissions": permissions, "topic_permissions": topics,
            "policies": policies}


def _management(settings: Settings) -> tuple[str, tuple[str, str]]:
    base = urlsplit(settings.rabbitmq_management_url or "")
    auth = (unquote(base.username or ""), unquote(base.password or ""))
    host = base.netloc.rpartition("@")[2]
    return urlunsplit((base.scheme, host, base.path.rstrip("/"), "", "")), auth


BROKER_STARTUP_SECONDS = 90
"""How long setup waits for a starting broker before it gives up, saying so."""


def rabbitmqctl_environment() -> dict[str, str]:
    """The environment rabbitmqctl runs in: ours without ``XDG_CONFIG_HOME``. Debian's
    rabbitmqctl runs Erlang as the ``rabbitmq`` user, which reads ``.erlang`` from that
    directory; a private one (casetrail's keys may live there) prints an error report
    on stdout ahead of the answer."""
    return {name: value for name, value in os.environ.items() if name != "XDG_CONFIG_HOME"}


def _rabbitmqctl(settings: Settings, *args: str, stdin: str | None = None) -> str:
    if shutil.which("rabbitmqctl") is None:
        raise PermanentError(
            "rabbitmqctl is not on this machine: set CASETRAIL_RABBITMQ_MANAGEMENT_URL to "
            "the broker's management API, or run setup where the broker runs")
    node = ["-n", settings.rabbitmq_node] if settings.rabbitmq_node else []
    result = subprocess.run(["rabbitmqctl", "-q", *node, *args], capture_output=True, text=True,
                            input=stdin, timeout=120, check=False,
                            env=rabbitmqctl_environment())
    if result.returncode != 0:
        raise PermanentError(f"rabbitmqctl {args[0]} failed: "
                             f"{result.stderr.strip() or result.stdout.strip()}")
    return result.stdout


def apply_broker_definitions(settings: Settings, definitions: dict[str, Any]) -> None:
    """Import ``definitions`` (idempotent: an import replaces what it names)."""
    if settings.rabbitmq_management_url:
        root, auth = _management(settings)
        try:
            with httpx.Client(auth=auth, timeout=30, follow_redirects=False) as client:
                reply = client.post(f"{root}/api/definitions", json=definitions)
        except httpx.HTTPError as exc:
            raise PermanentError(f"the management API did not answer: {exc}") from None
        if reply.status_code not in (200, 201, 204):
            raise PermanentError(f"importing definitions over HTTP failed: "
                                 f"{reply.status_code} {reply.text[:200]}")
        return
    # A broker that is (re)starting refuses imports until its 'rabbit' app runs: wait
    # for it, as long as a restart takes, instead of failing the demo's first run.
    _rabbitmqctl(settings, "await_startup", "--timeout", str(BROKER_STARTUP_SECONDS))
    # On standard input: no file with password hashes is left anywhere.
    _rabbitmqctl(settings, "import_definitions", "--format", "json",
                 stdin=json.dumps(definitions))


def namespace_users(settings: Settings) -> list[str]:
    """The broker users setup makes for the namespace: its components' and those of the
    capabilities it serves now or served when the secrets file was written."""
    kept = settings.stored_secrets().get("capabilities", {})
    capabilities = sorted({*served_capabilities(settings), *kept})
    return [*(settings.broker_user(c) for c in COMPONENTS),
            *(settings.capability_user(name) for name in capabilities)]


def remove_broker_users(settings: Settings, subscribers: Sequence[str] = ()) -> None:
    """The namespace's broker users (``subscribers``' too) and its policy (nothing of
    another namespace's)."""
    delete_broker_users(settings, [*namespace_users(settings), *subscribers],
                        policy=start_limit_policy(settings))


def delete_broker_users(settings: Settings, users: Sequence[str],
                        policy: str | None = None) -> None:
    """Delete ``users`` (and ``policy``); those already gone are no error."""
    if settings.rabbitmq_management_url:
        root, auth = _management(settings)
        vhost = quote(settings.amqp_vhost(), safe="")
        with httpx.Client(auth=auth, timeout=30) as client:
            client.post(f"{root}/api/users/bulk-delete", json={"users": list(users)})
            if policy is not None:
                client.delete(f"{root}/api/policies/{vhost}/{quote(policy, safe='')}")
        return
    steps: list[tuple[str, ...]] = [("delete_user", user) for user in users]
    if policy is not None:
        steps.append(("clear_policy", "-p", settings.amqp_vhost(), policy))
    for args in steps:
        try:
            _rabbitmqctl(settings, *args)
        except PermanentError as exc:
            if not any(gone in str(exc) for gone in ("no_such_user", "does not exist",
                                                     "not_found", "not found")):
                raise


async def declare_topology(settings: Settings) -> None:
    """Every exchange and queue of the namespace, declared by the admin: components may
    declare only their private queues (and a capability worker its capability's)."""
    connection = await connect(settings.amqp_url, "casetrail-setup")
    try:
        channel = await connection.channel()
        topology = Topology(settings.namespace)
        await topology.declare(channel)
        for capability in served_capabilities(settings):
            await topology.declare_capability_queue(channel, capability)
    finally:
        await connection.close()


# -- the whole step -----------------------------------------------------------------------

@dataclass(frozen=True)
class SetupReport:
    migrations: list[str]
    database_roles: list[str]
    broker_users: list[str]
    secrets_file: Path
    reapplied: list[str] = field(default_factory=list)
    """Revocations and retirements made again (a restored backup predated them)."""


async def setup(settings: Settings) -> SetupReport:
    """Create or update every identity, migrate as the owner, grant, import the broker
    definitions, declare the topology and write the secrets file. A master key is made
    only for a namespace with no personal data sealed under another."""
    await wait_for_services(settings)
    await check_not_others(settings, "set up")  # another namespace's database: refused first
    await refuse_new_keys(settings, key_files=False)
    identities = plan_identities(settings)
    applied = await setup_database(settings, {c: identities.password(c, "database_url")
                                              for c in DATABASE_COMPONENTS})
    # The worker's key, registered as the operator (from its public half where setup
    # may not read the private key).
    key = settings.signing_public_key_file or settings.signing_key_file
    if key:
        await register_signing_key(settings, key)
    # The API's action key, likewise: no component may register one.
    action_key = settings.action_public_key_file or settings.action_key_file
    if action_key:
        await register_signing_key(settings, action_key, "action_keys")
    # The auditor's key, likewise (made beside the stack's files when none is given).
    await register_signing_key(settings, settings.audit_public_key_file
                               or audit_key_spec(settings, make=True) or "", "audit_keys")
    await register_capability_keys(settings, identities)
    apply_broker_definitions(settings, broker_definitions(settings, identities))
    await declare_topology(settings)
    write_secrets(settings.secrets_path(), identities)
    reapplied = [f"{r.kind} {r.key_id}" for r in await revocations.reapply(settings)]
    reapplied += await retention_journal.reapply(settings)
    return SetupReport(applied, [settings.database_role("owner"),
                                 *(settings.database_role(c) for c in DATABASE_COMPONENTS)],
                       namespace_users(settings), settings.secrets_path(), reapplied)


async def register_signing_key(settings: Settings, key: Path | str,
                               table: KeyTable = "signing_keys") -> PublicKey:
    """``casetrail signer register [--actions|--audit]``: record the public key of ``key``
    (a worker's PEM key, the API's action key or the auditor's, or its public half, as a
    file; or a key from ``env:`` or ``provider:``) in ``signing_keys`` (or
    ``action_keys``, ``audit_keys``), on the bootstrap connection; idempotent."""
    public_key = read_public_key(Path(key)) if is_file(str(key)) \
        else signer_from(str(key), settings).public_key
    pool = await create_pool(settings.database_url, max_size=1)
    try:
        return await KeyRegistry(pool, table).register(key_id(public_key), public_key)
    finally:
        await pool.close()


async def register_capability_keys(settings: Settings, identities: Identities) -> None:
    """Each served capability's public sealing key, registered as the operator."""
    keys = {name: sealing.private_key(text, name)
            for name, text in identities.sealing_keys.items()}
    for name, secret in settings.capability_sealing_keys.items():
        keys[name] = sealing.private_key(secret.get_secret_value(), name)
    pool = await create_pool(settings.database_url, max_size=1)
    try:
        registry = CapabilityKeyRegistry(pool)
        for name, key in sorted(keys.items()):
            await registry.register(name, sealing.public_bytes(key))
    finally:
        await pool.close()


async def remove(settings: Settings) -> list[Path]:
    """Undo ``setup`` for a namespace: its database, roles, broker users, queues and
    exchanges, its broker policy, its secrets file and the ledger's state file (tests,
    benchmarks, ``casetrail setup --remove``); the files removed. Nothing of another
    namespace: a database holding another's objects is refused before anything is
    removed."""
    await check_removable(settings)
    subscribers = await subscriber_names(settings)
    async for attempt in AsyncRetrying(retry=retry_if_exception(_queue_recovering),
                                       stop=stop_after_delay(REMOVE_WAIT_SECONDS),
                                       wait=wait_fixed(1.0), reraise=True):
        with attempt:
            await _remove_from_bus(settings, subscribers)
    await remove_database(settings)
    remove_broker_users(settings, [f"{settings.namespace}-subscriber-{n}" for n in subscribers])
    settings.secrets_path().unlink(missing_ok=True)
    return [path for path in _local_state(settings) if _unlink(path)]


def _local_state(settings: Settings) -> list[Path]:
    """The namespace's files beside its keys: the ledger's high-water mark and the
    auditor's last pass. Left behind, they would halt a namespace made again under the
    same name as "behind" (its log signed a larger tree than the new one holds), or have
    its first audit find passes "removed". The auditor's key too, when it is the one
    setup made beside the stack's files (its database, where it is registered, is gone)."""
    files = [local_audit_key(settings)] if not (
        settings.audit_key_file or settings.audit_public_key_file) else []
    with suppress(PermanentError):  # a key from the environment, no state file configured
        files.append(audit_state_file(settings))
    # The ledger's: as configured, else beside the log key `up` and `demo` make for the
    # namespace (a shell that never set CASETRAIL_LOG_KEY_FILE still finds it).
    log_key = settings.log_key_file or str(local_file(f"{settings.namespace}.log-key"))
    with suppress(PermanentError):
        files.append(state_file_for(log_key, settings.namespace, settings.ledger_state_file))
    return files


def _unlink(path: Path) -> bool:
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


# A cluster that has just got its majority back takes a few seconds to restart a queue's
# leader; until then deleting that queue answers NOT_FOUND "... is down or inaccessible".
REMOVE_WAIT_SECONDS = 90.0


def _queue_recovering(error: BaseException) -> bool:
    return (isinstance(error, aiormq.exceptions.ChannelNotFoundEntity)
            and "down or inaccessible" in str(error))


async def _remove_from_bus(settings: Settings, subscribers: list[str]) -> None:
    """Delete the namespace's queues and exchanges (deleting what is gone is no error,
    so a retry after a queue that was still recovering starts again from the top)."""
    connection = await connect(settings.amqp_url, "casetrail-setup")
    try:
        channel = await connection.channel()
        await Topology(settings.namespace).delete_all(channel, served_capabilities(settings))
        for name in subscribers:
            await channel.queue_delete(f"{settings.namespace}.subscriber.{name}",
                                       if_unused=False, if_empty=False)
    finally:
        await connection.close()

