"""Settings, from the environment (``CASETRAIL_*``), through pydantic-settings."""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import unquote, urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic.alias_generators import to_camel
from pydantic_settings import BaseSettings, SettingsConfigDict

from casetrail.contract.events import MAX_EVENT_BYTES
from casetrail.contract.model_providers import RemoteProvider
from casetrail.errors import PermanentError

Component = Literal["api", "worker", "consumer", "capability", "ledger", "witness", "auditor"]
COMPONENTS: tuple[Component, ...] = ("api", "worker", "consumer", "ledger")
"""The components with one identity each. A capability worker has none of its own: it
connects as the user of each capability it serves (``capability_identity``)."""
DATABASE_COMPONENTS: tuple[Component, ...] = ("api", "worker", "consumer", "ledger", "auditor")
"""The components with a database role of their own. The capability workers reach no
database; the auditor (``casetrail audit``) reaches no broker: it reads the log and
appends its passes, as its own role, never as the bootstrap (superuser) URL."""
CAPABILITY_NAME = r"^[a-z0-9][a-z0-9-]{0,62}$"

def config_home() -> Path:
    """The user's configuration directory for casetrail: ``$XDG_CONFIG_HOME/casetrail``,
    else ``~/.config/casetrail``."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "casetrail"


def project_dir(start: Path | None = None) -> Path | None:
    """The nearest ``.casetrail/`` in ``start`` (the working directory) or a folder above
    it: where an earlier casetrail kept a developer stack's files."""
    here = (start or Path.cwd()).resolve()
    return next((folder / ".casetrail" for folder in (here, *here.parents)
                 if (folder / ".casetrail").is_dir()), None)


def local_dir() -> Path:
    """Where a stack keeps what it makes (signing keys, the secrets file):
    ``CASETRAIL_HOME``, else the user's configuration directory (``config_home``)."""
    if home := os.environ.get("CASETRAIL_HOME"):
        return Path(home)
    return config_home()


def local_file(name: str, start: Path | None = None) -> Path:
    """The file ``name`` of a stack, found so that the command line works from any
    directory: under ``CASETRAIL_HOME`` when it is set; else in the user's configuration
    directory, or — only when it is not there — in the project's ``.casetrail/``
    (``project_dir``). The two holding different files of that name is an error, never
    a guess; a file found in neither is made in the configuration directory."""
    if os.environ.get("CASETRAIL_HOME"):
        return local_dir() / name
    home, project = config_home() / name, project_dir(start)
    old = None if project is None else project / name
    if old is None or not old.is_file():
        return home
    if not home.is_file():
        return old
    if home.read_bytes() != old.read_bytes():
        raise PermanentError(f"{home} and {old.resolve()} both hold {name}, and they differ: "
                             "which one this namespace's data is under is not for casetrail "
                             "to guess. Keep one (or set CASETRAIL_HOME to the folder that "
                             "holds the right one)")
    return home


@dataclass(frozen=True)
class Identity:
    """Whom one component connects as."""

    component: Component
    amqp_url: str
    database_url: str | None

    @property
    def database(self) -> str:
        if self.database_url is None:
            raise PermanentError(f"the {self.component} has no database identity")
        return self.database_url


class TenantQuota(BaseModel):
    """One tenant's limits and policies, where they differ from the defaults."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    max_active_cases: int | None = Field(default=None, ge=1)
    max_starts_per_minute: int | None = Field(default=None, ge=1)
    review_every_case: bool = Field(
        default=False, description="A person decides every case of this tenant, whatever "
        "its agent would let stand.")
    override_reviewers: int = Field(
        default=1, ge=1, le=2, description="How many distinct persons an override takes: "
        "with 2, a reviewer's override waits for a second person to confirm (or change, "
        "or return) it before it decides the case.")
    review_deadline_seconds: float | None = Field(
        default=None, gt=0, description="How long a case may wait for a person before its "
        "review is overdue (shown, counted, alerted on; it never decides); unset: the "
        "agent's, else CASETRAIL_REVIEW_DEADLINE_SECONDS.")


@dataclass(frozen=True)
class ReviewPolicy:
    """What a tenant asks of the people deciding its cases (``TenantQuota``)."""

    every_case: bool = False
    override_reviewers: int = 1
    deadline_seconds: float | None = None
    """The tenant's review deadline; ``None``: the agent's, else the deployment's."""




def amqp_nodes(url: str) -> list[str]:
    """The URLs of an AMQP URL setting: one, or several of one cluster (commas)."""
    return [u.strip() for u in url.split(",") if u.strip()]


class ModelEndpoint(BaseModel):
    """An operator-defined model endpoint: a case names it, and only its own key (from
    the variable ``apiKeyEnv``) is ever sent to its ``baseUrl``."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]{0,63}$")
    provider: RemoteProvider
    base_url: str = Field(max_length=2000)
    api_key_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$",
                                    description="The environment variable holding this "
                                    "endpoint's key; none: the endpoint takes no key.")

    @field_validator("base_url")
    @classmethod
    def _https_or_loopback(cls, value: str) -> str:
        return https_or_loopback(value, "baseUrl")


ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"


def _loopback(host: str) -> bool:
    """``localhost``, or an IP literal of a loopback address (127.0.0.0/8, ::1); never a
    name that merely starts like one (``127.attacker.example``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def https_or_loopback(value: str, what: str) -> str:
    """``value`` when it is an https URL, or plain http to a loopback address (a key
    must not cross a network in clear); ``ValueError`` naming ``what`` otherwise."""
    parts = urlsplit(value)
    host = (parts.hostname or "").lower()
    if parts.scheme == "https" and host:
        return value.rstrip("/")
    if parts.scheme == "http" and _loopback(host):
        return value.rstrip("/")
    raise ValueError(f"{what} must be https://, or plain http:// to a loopback address "
                     "only (a key must not cross a network in clear)")


class McpServer(BaseModel):
    """An MCP server whose tools agents may use (docs/design.md, "MCP tools"), served by
    the capability ``mcp-<name>``: a program the capability worker runs and speaks to
    over stdio, or a Streamable HTTP endpoint. Its credentials come from the capability
    worker's environment, named here by variable, never written in this setting."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,58}$")
    transport: Literal["stdio", "http"]
    command: list[str] | None = Field(default=None, min_length=1, description="stdio: the "
                                      "program and its arguments (a string is split as a "
                                      "shell would).")
    url: str | None = Field(default=None, max_length=2000, description="http: the endpoint.")
    env: dict[Annotated[str, Field(pattern=ENV_NAME)], Annotated[str, Field(pattern=ENV_NAME)]
              ] = Field(default_factory=dict, description="stdio: the program's variables, "
                        "each given the value of a variable of the capability worker's own "
                        "environment (program's name → ours).")
    headers_env: dict[Annotated[str, Field(pattern=r"^[A-Za-z0-9-]{1,64}$")],
                      Annotated[str, Field(pattern=ENV_NAME)]] = Field(
        default_factory=dict, description="http: headers sent with every request, each "
        "the value of a variable of the capability worker's environment (header → variable).")
    timeout_seconds: float = Field(default=30.0, gt=0, le=600, description="How long one "
                                   "call may take.")
    attempts: int = Field(default=4, ge=1, le=10, description="Attempts of a call to a tool "
                          "the server annotates read-only or idempotent (others: one).")

    @field_validator("command", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        return shlex.split(value) if isinstance(value, str) else value

    @model_validator(mode="after")
    def _transport_has_its_address(self) -> McpServer:
        if self.transport == "stdio" and (self.command is None or self.url is not None
                                          or self.headers_env):
            raise ValueError(f"MCP server {self.name!r}: stdio takes a command (and env), "
                             "not a url or headersEnv")
        if self.transport == "http":
            if self.url is None or self.command is not None or self.env:
                raise ValueError(f"MCP server {self.name!r}: http takes a url (and "
                                 "headersEnv), not a command or env")
            self.url = https_or_loopback(self.url, f"MCP server {self.name!r}: url")
        return self

    def from_environment(self, names: Mapping[str, str]) -> dict[str, str]:
        """``names`` (ours → variable) with each variable's value from this process's
        environment; a variable that is not set is a ``PermanentError`` naming it."""
        missing = sorted(v for v in names.values() if v not in os.environ)
        if missing:
            raise PermanentError(f"MCP server {self.name!r} takes its credentials from "
                                 f"{', '.join(missing)}, which this environment does not set")
        return {ours: os.environ[variable] for ours, variable in names.items()}


class A2aAgent(BaseModel):
    """A remote A2A agent that agents may call as a tool (``A2aTool``; docs/a2a.md,
    "Remote agents as tools"), served by the capability ``a2a-<name>``. Its card is
    pinned: ``cardDigest`` is the SHA-256 of the card's canonical JSON as the operator
    accepted it (``casetrail a2a-agents`` prints the one served now); a card that differs
    is refused until the operator accepts the new digest. Credentials come from the
    capability worker's environment, named here by variable."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,58}$")
    card_url: str = Field(max_length=2000, description="The agent's card (its "
                          "/.well-known/agent-card.json).")
    card_digest: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$", description=(
        "The pinned card's SHA-256 (hex, of its RFC 8785 JSON); without it every call is "
        "refused, naming the digest served now."))
    headers_env: dict[Annotated[str, Field(pattern=r"^[A-Za-z0-9-]{1,64}$")],
                      Annotated[str, Field(pattern=ENV_NAME)]] = Field(
        default_factory=dict, description="Headers sent with every request (the card's and "
        "the calls'), each the value of a variable of the capability worker's environment.")
    sensitive_fields: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(
        default_factory=list, description="The input fields that may carry a case's "
        "sensitive values to this agent; a sensitive value in any other field is refused.")
    timeout_seconds: float = Field(default=60.0, gt=0, le=3600, description="How long one "
                                   "call may take, the remote task followed to its end.")
    attempts: int = Field(default=3, ge=1, le=10, description="Attempts of a call (each "
                          "sends the same messageId: an agent that keeps message ids, as "
                          "casetrail's own do, starts one task).")

    @model_validator(mode="after")
    def _https_card(self) -> A2aAgent:
        self.card_url = https_or_loopback(self.card_url, f"A2A agent {self.name!r}: cardUrl")
        return self

    def headers(self) -> dict[str, str]:
        """``headersEnv`` with each variable's value from this process's environment; a
        variable that is not set is a ``PermanentError`` naming it."""
        missing = sorted(v for v in self.headers_env.values() if v not in os.environ)
        if missing:
            raise PermanentError(f"A2A agent {self.name!r} takes its credentials from "
                                 f"{', '.join(missing)}, which this environment does not set")
        return {header: os.environ[variable] for header, variable in self.headers_env.items()}


DEFAULT_DATABASE_SERVER = "postgresql://postgres@127.0.0.1:5432/"


# The components' young-object collection threshold (service/components/gc_tuning.py says
# why it is raised; the figures are in docs/benchmarks.md).
GC_THRESHOLD = 50_000


class Settings(BaseSettings):
    """Every knob casetrail reads. Each field is ``CASETRAIL_<NAME>`` in the environment."""

    model_config = SettingsConfigDict(env_prefix="CASETRAIL_", extra="ignore")

    amqp_url: str = "amqp://guest:guest@127.0.0.1:5672/"
    database_url: str = Field(
        default=DEFAULT_DATABASE_SERVER + "casetrail",
        description="The bootstrap (admin) URL of the namespace's database. Unset, each "
        "namespace gets a database of its own, named after it, so two stacks on one "
        "server never share tables.")
    namespace: str = Field(default="casetrail", pattern=r"^[a-z0-9][a-z0-9_.-]{0,53}$",
                           description="Prefix of every queue, exchange, database role "
                           "and broker user (54 characters at most: a Postgres role name "
                           "has 63).")

    amqp_fastpath: bool = Field(
        default=True,
        description="Let the worker, consumer and API publish and consume below aiormq's "
        "public API (service/adapters/bus/fastpath.py) when the installed aiormq and pamqp are the "
        "versions it was written for; off: the public path only.",
    )

    api_database_url: str | None = Field(default=None, description="The API's own login "
        "role (see `casetrail setup`); default: from the secrets file.")
    worker_database_url: str | None = Field(default=None, description="The worker's own role.")
    consumer_database_url: str | None = Field(default=None, description="The consumer's own "
        "role.")
    api_amqp_url: str | None = Field(default=None, description="The API's own broker user; "
        "default: from the secrets file.")
    worker_amqp_url: str | None = Field(default=None, description="The worker's broker user.")
    consumer_amqp_url: str | None = Field(default=None, description="The consumer's broker "
        "user.")
    capability_amqp_urls: dict[str, str] = Field(
        default_factory=dict, description="Each capability's own broker user, by capability "
        "name (JSON): a capability worker connects as the user of each capability it serves, "
        "and may read that capability's requests only. Default: from the secrets file.")
    capability_sealing_keys: dict[str, SecretStr] = Field(
        default_factory=dict, description="Each capability's X25519 private key (base64 of "
        "32 random bytes), by capability name (JSON): tool requests carry the sensitive "
        "values their call needs sealed to it, and only that capability's workers open "
        "them. `casetrail setup` registers the public halves. Default: from the secrets "
        "file, where setup puts a new key for each capability that has none.")
    agents: list[Annotated[str, Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")]] = Field(
        default_factory=list, description="Agents (or capabilities) to load beside the "
        "built-in ones and those installed packages offer through the entry points "
        "casetrail.agents and casetrail.capabilities: `module:attr` each (JSON list).")
    subscriber_max_events: int = Field(
        default=100_000, ge=1, description="Events a subscriber's queue holds at most; beyond "
        "it the oldest are dropped (a stalled subscriber never fills the broker).")
    subscriber_max_bytes: int = Field(
        default=64 * 1024 * 1024, ge=1024, description="Bytes a subscriber's queue holds at "
        "most (then the oldest events are dropped).")
    mcp_servers: list[McpServer] = Field(
        default_factory=list, description="MCP servers whose tools agents may use "
        "(`McpTool`): each served by the capability `mcp-<name>`, which `casetrail setup` "
        "gives a queue, a broker user and a sealing key (JSON list of {name, transport: "
        "stdio|http, command | url, env | headersEnv, timeoutSeconds, attempts}).")
    a2a_agents: list[A2aAgent] = Field(
        default_factory=list, description="Remote A2A agents that agents may call as tools "
        "(`A2aTool`): each served by the capability `a2a-<name>`, which `casetrail setup` "
        "gives a queue, a broker user and a sealing key (JSON list of {name, cardUrl, "
        "cardDigest, headersEnv, sensitiveFields, timeoutSeconds, attempts}).")
    services_wait_seconds: float = Field(
        default=60.0, ge=0, le=3600, description="How long setup, up and demo wait for "
        "RabbitMQ and PostgreSQL to accept connections before giving up.")
    mcp_catalog_seconds: float = Field(
        default=30.0, gt=0, le=3600, description="How often a worker reads each MCP "
        "server's catalog again, in the background (a case start takes the one it has).")
    extra_capabilities: list[Annotated[str, Field(pattern=CAPABILITY_NAME)]] = Field(
        default_factory=list, description="Capabilities served beyond those of the installed "
        "agents: `casetrail setup` gives each its queue and broker user as it does the "
        "agents' own.")
    ledger_database_url: str | None = Field(default=None, description="The ledger's own "
        "role (the transparency log's sequencer).")
    auditor_database_url: str | None = Field(default=None, description="The auditor's own "
        "role (`casetrail audit`): reads the log, the cases and the transparency log, "
        "appends its passes; nothing else.")
    ledger_amqp_url: str | None = Field(default=None, description="The ledger's broker user "
        "(publishes ledger.checkpoint).")
    master_key: SecretStr | None = Field(
        default=None, description="Base64 of 32 random bytes: wraps each case's data key "
        "(sensitive input fields). The API and the worker need it; default: from the "
        "secrets file, where `casetrail setup` puts a new one when none is set.")
    secrets_file: str | None = Field(
        default=None,
        description="Where `casetrail setup` writes the identities it made (mode 0600) and "
        "where components look for their own when no CASETRAIL_<COMPONENT>_*_URL is set. "
        "Default: .casetrail/<namespace>.identities.json.")
    a2a_default_agent: str | None = Field(
        default=None, max_length=100,
        description="The agent whose A2A card the host's /.well-known/agent-card.json "
        "serves (every agent has its own at /a2a/<agent>/.well-known/agent-card.json). "
        "Default: the first agent offered.")
    archive_dir: str | None = Field(
        default=None,
        description="Where the retention pass archives the bundles of cases whose policy "
        "archives them before they expire: a directory (a mounted WORM volume, an "
        "object-store mount) every worker shares, or an S3 bucket, s3://bucket[/prefix] "
        "(credentials from the AWS SDK's chain: AWS_* variables, profile, instance role). "
        "Default: archive/<namespace> in the folder a stack keeps its files "
        "(CASETRAIL_HOME).")
    archive_s3_endpoint: str | None = Field(
        default=None, pattern=r"^https?://",
        description="The endpoint of an S3-compatible store (MinIO, Ceph, a cloud's own) "
        "when CASETRAIL_ARCHIVE_DIR is s3://...; default: AWS's.")
    signing_key_file: str | None = Field(
        default=None,
        description="The worker's Ed25519 signing key (PEM, from `casetrail signer "
        "generate`). A worker refuses to start without one.",
    )
    signing_public_key_file: str | None = Field(
        default=None,
        description="The public half of the worker's key (`signer generate --public-out`), "
        "for `casetrail setup` to register where it must not read the private key; "
        "otherwise setup registers CASETRAIL_SIGNING_KEY_FILE's.",
    )
    action_key_file: str | None = Field(
        default=None,
        description="The API's Ed25519 action key (PEM, from `casetrail signer generate`): "
        "it signs every action of a person's (a review, an answer, a cancel of a waiting "
        "case), and the worker acts only on actions signed by a registered action key. The "
        "API refuses to start without one. Its own file, never the secrets file.",
    )
    action_public_key_file: str | None = Field(
        default=None,
        description="The public half of the API's action key, for `casetrail setup` to "
        "register where it must not read the private key; otherwise setup registers "
        "CASETRAIL_ACTION_KEY_FILE's.",
    )

    rabbitmq_node: str | None = Field(
        default=None, description="The node `casetrail setup` runs rabbitmqctl against "
        "(`-n`), when it is not the machine's default node.")
    rabbitmq_management_url: str | None = Field(
        default=None, description="The broker's management HTTP API, with credentials "
        "(http://user:pass@host:15672): `casetrail setup` sets policies through it instead "
        "of rabbitmqctl (docker-compose).")
    start_queue_max_length: int = Field(
        default=100_000, ge=1, description="Start commands the start queue holds before the "
        "broker refuses more (a policy `casetrail setup` sets); POST /cases then answers 503.")
    tenant_max_active_cases: int = Field(
        default=1000, ge=1, description="Cases one tenant may have queued or running at once; "
        "beyond it POST /cases answers 429 with Retry-After.")
    tenant_max_starts_per_minute: int = Field(
        default=600, ge=1, description="Cases one tenant may start in any minute; beyond it "
        "429 with Retry-After.")
    tenant_max_key_searches_per_minute: int = Field(
        default=120, ge=1, description="Searches by business key (GET /cases?key=…) one "
        "tenant may make in any minute, per API process; beyond it 429 with Retry-After "
        "(a key search tells whether a case holds a value).")
    tenant_quotas: dict[str, TenantQuota] = Field(
        default_factory=dict,
        description='Per-tenant overrides, JSON: {"acme": {"maxActiveCases": 50, '
        '"maxStartsPerMinute": 120, "reviewEveryCase": true, "overrideReviewers": 2, '
        '"reviewDeadlineSeconds": 14400}}.')
    backtest_gates: dict[str, Annotated[float, Field(ge=0, le=1)]] = Field(
        default_factory=dict,
        description='Agents whose installed version takes no case before a backtest of '
        'that very version (its agentDigest) passed, JSON: {"loan-officer": 0.9}: agreement '
        "with reviewers at least 0.9 on the backtest's reviewed cases (docs/backtests.md, "
        '"A rollout gate"). None by default.')
    backtest_gate_min_reviewed: int = Field(default=50, ge=1, description="The reviewed "
        "cases a backtest must hold to open a rollout gate, besides a selection nobody "
        "picked (a time window or all the agent's decided cases, never a list of cases): "
        "at 50 reviewed cases all agreeing, the agreement's 95 % Wilson lower bound is "
        "0.93, above a 0.9 gate; at 30 it is 0.89 (docs/backtests.md, \"A rollout gate\").")
    review_deadline_seconds: float = Field(
        default=86_400.0, gt=0, description="How long a case may wait for a person before "
        "its review is overdue, unless its agent or tenant says otherwise: overdue reviews "
        "are counted (casetrail_reviews_overdue), alerted on and marked in the viewer; a "
        "review deadline never decides a case.")

    oidc_issuer: str | None = Field(
        default=None, description="OIDC issuer (iss) whose JWTs the API accepts beside API "
        "keys; with the audience and the JWKS URL, OIDC is on.")
    oidc_audience: str | None = Field(default=None, description="The aud a token must carry.")
    oidc_jwks_url: str | None = Field(default=None, description="The issuer's JWKS URL.")
    oidc_tenant_claim: str = Field(default="tenant", description="The claim naming the tenant.")
    oidc_scopes_claim: str = Field(
        default="scope", description="The claim with the scopes (space-separated or a list).")

    bench_mode: bool = Field(
        default=False,
        description="Allow what only benchmarks and tests may use: the throughput-probe "
        "agent and the scripted model's latencyMs. Off, the API refuses them (422).",
    )

    log_level: str = Field(default="INFO", pattern=r"^(DEBUG|INFO|WARNING|ERROR)$")
    log_format: Literal["text", "json"] = Field(
        default="text",
        description="How log lines are written: text (human-readable, the bound fields "
        "after the message) or json (one object a line). Every line carries component, "
        "case_id, tenant and attempt where they apply.")

    api_host: str = "127.0.0.1"
    api_port: int = 8000
    max_body_bytes: int = Field(default=256 * 1024, description="Larger request bodies get 413.")
    api_keep_alive_seconds: int = Field(
        default=65, gt=0,
        description="How long the API keeps an idle HTTP connection open. Longer than "
        "the idle expiry of the clients and proxies in front of it (httpx 5 s, load "
        "balancers commonly 60 s): a server that closes first can close a connection just "
        "as a client sends on it, and the client sees the request fail.")
    stream_ping_seconds: float = Field(default=15.0, gt=0, description="A comment line on "
                                       "an idle event stream this often (keeps proxies from "
                                       "closing it; a revoked key's stream ends at one).")
    stream_max_per_key: int = Field(default=20, gt=0, description="Event streams one API "
                                    "key or token may hold open in one API process (429 "
                                    "beyond).")
    stream_max_per_tenant: int = Field(default=500, gt=0, description="Event streams one "
                                       "tenant may hold open in one API process (429 "
                                       "beyond).")
    public_url: str = Field(default="", description="Where people reach the API (the "
                            "viewer links `casetrail demo` prints); http://<host>:<port> "
                            "when empty.")
    max_cycles_cap: int = Field(default=50, description="Highest maxCycles a case may ask for.")
    max_event_bytes: int = Field(
        default=MAX_EVENT_BYTES, ge=65_536, le=MAX_EVENT_BYTES,
        description="The largest event the worker publishes, in bytes (at most 1 MiB, what "
        "a consumer accepts): a tool result whose event would be larger is recorded as a "
        "tool error naming its size and SHA-256, and the model sees that error. Lower it "
        "for a broker whose max_message_size is smaller.")
    max_deadline_seconds: float = Field(
        default=600.0,
        description="Highest deadline a case may ask for; well below RabbitMQ's 30 min "
        "consumer_timeout, which would otherwise close the worker's channel.",
    )

    worker_concurrency: int = Field(default=256, description="Cases one worker runs at once.")
    lease_seconds: float = Field(default=15.0, description="A worker's claim on a running case.")
    publish_retry_seconds: float = Field(
        default=60.0, gt=0,
        description="How long a worker keeps publishing an event again through a broker "
        "outage or refusal (a node lost: the connection moves, a queue elects its new "
        "leader) before it hands the case back for its next attempt.")
    retention_seconds: float = Field(
        default=300.0, gt=0,
        description="How often a worker runs the retention pass: expires the cases past "
        "their time under the policy in force that no legal hold keeps, and erases "
        "personal data on its earlier deadline (service/components/retention.py). With no "
        "policy set (the default) it deletes nothing.")
    sweep_seconds: float = Field(
        default=10.0, gt=0,
        description="How often a worker looks for stranded cases (a lease lapsed over a "
        "lease ago, no terminal event) and sends their start command again; one worker "
        "at a time sweeps (service/components/sweeper.py).")

    consumer_prefetch: int = 2000
    consumer_batch_size: int = 500
    consumer_linger_ms: float = 5.0
    consumer_busy_linger_ms: float = Field(
        default=25.0, ge=0,
        description="How long the consumer waits for a batch to fill while it is under "
        "load (its last batch held 10 events or more); consumer_linger_ms otherwise.",
    )
    event_loop: Literal["uvloop", "asyncio"] = Field(
        default="uvloop",
        description="The event loop the long-running components run on: uvloop (the default, a "
        "faster loop with asyncio's semantics) or Python's own asyncio loop.",
    )
    gc_threshold: int = Field(
        default=GC_THRESHOLD, ge=0,
        description="Net allocations between young-object garbage collections in the "
        "long-running components (service/components/gc_tuning.py); 0 keeps Python's default.",
    )

    openai_api_key: SecretStr | None = Field(
        default=None, description="Falls back to OPENAI_API_KEY. Never logged or recorded."
    )
    anthropic_api_key: SecretStr | None = Field(
        default=None, description="Falls back to ANTHROPIC_API_KEY. Never logged or recorded."
    )
    model_endpoints: list[ModelEndpoint] = Field(
        default_factory=list,
        description='Named model endpoints a case may choose, JSON: [{"name": "local", '
        '"provider": "openai", "baseUrl": "http://127.0.0.1:11434/v1", "apiKeyEnv": '
        '"LOCAL_LLM_KEY"}]. A case names one ("endpoint") or gives its exact baseUrl.')
    model_timeout_seconds: float = Field(default=120.0, gt=0, description="One model "
                                         "request, at most (a case's deadline may cut it "
                                         "shorter).")
    model_connect_timeout_seconds: float = Field(default=10.0, gt=0, description="Opening "
                                                 "a connection to a model endpoint.")
    model_pool_size: int = Field(default=256, ge=1, description="Connections one worker "
                                 "keeps to each model endpoint, shared by all its cases.")
    model_proxy: SecretStr | None = Field(
        default=None, description="An egress proxy for requests to https model endpoints "
        "(http://[user:password@]host:port): each connection is a CONNECT tunnel, so the "
        "proxy sees the host, never a key or a conversation. Loopback endpoints never use "
        "it; HTTPS_PROXY and the like are not read.")
    model_ca_file: str | None = Field(
        default=None, description="PEM file of the certificate authorities that model "
        "endpoints' certificates are checked against instead of the system's (a gateway "
        "inside the organisation, or a proxy that inspects TLS).")

    metrics_host: str = Field(default="127.0.0.1", description="Where each component "
                              "serves /metrics (0.0.0.0 for a scraper on another host).")
    api_metrics_port: int | None = Field(default=None, ge=0, le=65535, description=
        "The API's metrics port (not the API port). Unset: 9101, or any free port when "
        "another process holds it; 0: any free port. The bound port is logged.")
    worker_metrics_port: int | None = Field(default=None, ge=0, le=65535, description=
        "The worker's metrics port; unset: 9102 or, when taken, any free port.")
    consumer_metrics_port: int | None = Field(default=None, ge=0, le=65535, description=
        "The consumer's metrics port; unset: 9103 or, when taken, any free port.")
    capability_metrics_port: int | None = Field(default=None, ge=0, le=65535, description=
        "A capability worker's metrics port; unset: 9104 or, when taken, any free port.")
    ledger_metrics_port: int | None = Field(default=None, ge=0, le=65535, description=
        "The ledger's metrics port; unset: 9105 or, when taken, any free port.")
    witness_metrics_port: int | None = Field(default=None, ge=0, le=65535, description=
        "A long-running witness's metrics port; unset: 9106 or, when taken, any free port.")
    auditor_metrics_port: int | None = Field(default=None, ge=0, le=65535, description=
        "`casetrail audit --every`'s metrics port; unset: 9107 or, when taken, any free "
        "port.")
    audit_key_file: str | None = Field(default=None, description="The auditor's Ed25519 "
        "key (PEM, from `casetrail signer generate`): `casetrail audit` signs every pass it "
        "keeps, and believes a kept pass only under a key registered in audit_keys. Unset: "
        "<namespace>.audit-key.pem in the folder a stack keeps its files (CASETRAIL_HOME), "
        "which `casetrail setup` makes when it is missing.")
    audit_public_key_file: str | None = Field(default=None, description="The public half of "
        "the auditor's key, for `casetrail setup` to register where it must not read the "
        "private key; otherwise setup registers CASETRAIL_AUDIT_KEY_FILE's.")
    audit_state_file: str | None = Field(default=None, description="Where the auditor "
        "remembers the last pass it kept (its chain position and hash), off the database, "
        "so that passes removed from the end of the chain are found (default: "
        "<audit key file>.<namespace>.state.json).")
    audit_scrub_seconds: float = Field(default=30.0, ge=0, description="How long each pass "
        "of `casetrail audit` spends re-verifying stored cases in turn (the scrub), going on "
        "from where the last pass stopped: a pass every 600 s scrubs with 5 % of one core. "
        "0 turns the scrub off (only new and failing cases are re-verified then).")
    queue_probe_seconds: float = Field(default=5.0, gt=0, description="How often the "
                                       "worker and the consumer read their queues' depth "
                                       "for the metrics.")

    log_key_file: str | None = Field(default=None, description="The transparency log's "
        "Ed25519 key: a file holding a signed-note signer key (PRIVATE+KEY+<origin>+...), "
        "made by `casetrail ledger key generate`. The ledger alone reads it.")
    key_provider: str | None = Field(default=None, description="The operator's key "
        "provider, as package.module:factory (a KeyProvider: private_key(name) -> bytes), "
        "for key settings written provider:NAME (casetrail.trail.key_source).")
    revocations_file: str | None = Field(default=None, description="The journal of API "
        "keys revoked and signing keys retired, kept outside the database so that `setup` "
        "re-applies them after a restore (default: <ns>.revocations.jsonl beside the "
        "secrets file). Back it up with the secrets file.")
    ledger_state_file: str | None = Field(default=None, description="Where the ledger keeps "
        "its high-water mark, the largest checkpoint it signed, off its database (default: "
        "beside the log key, <CASETRAIL_LOG_KEY_FILE>.<namespace>.state.json). Back it up "
        "with the key.")
    log_origin: str | None = Field(default=None, pattern=r"^[^\s+]+$", description="The "
        "log's name, the first line of its checkpoints (a schema-less URL such as "
        "audit.example.com/casetrail); default: casetrail/<namespace>.")
    checkpoint_seconds: float = Field(default=5.0, gt=0, description="A new signed "
        "checkpoint whenever the tree grew, at most this often.")
    ledger_batch_size: int = Field(default=5000, ge=1, description="Leaves the ledger "
        "appends in one transaction, at most.")
    ledger_witnesses: list[str] = Field(default_factory=list, description="Verifier keys "
        "(<name>+<hash>+<key>, cosignature/v1) of the witnesses whose cosignatures "
        "POST /ledger/cosignatures accepts and bundles carry.")

    capability_concurrency: int = 64
    tool_timeout_seconds: float = 10.0
    tool_attempts: int = 3


    @field_validator("model_proxy")
    @classmethod
    def _proxy_url(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            parts = urlsplit(value.get_secret_value())
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError("model_proxy must be http://[user:password@]host:port "
                                 "(or https://)")
        return value

    def environment(self, **extra: str) -> dict[str, str]:
        """This process's environment with every setting set as ``CASETRAIL_<NAME>``
        (then ``extra``), so that a component started with it reads these settings."""
        env = dict(os.environ)
        values = self.model_dump(mode="json", by_alias=True)
        for name in values:  # a child needs the secret itself, not its mask
            secret = getattr(self, name)
            if isinstance(secret, SecretStr):
                values[name] = secret.get_secret_value()
            elif isinstance(secret, dict):
                values[name] = {k: v.get_secret_value() if isinstance(v, SecretStr) else v
                                for k, v in values[name].items()}
        env.update({f"CASETRAIL_{name.upper()}":
                    json.dumps(value) if isinstance(value, dict | list) else str(value)
                    for name, value in values.items() if value is not None})
        env.update(extra)
        return env

    def amqp_vhost(self) -> str:
        """The virtual host of ``amqp_url`` (``/`` when the URL names none; a cluster's
        URLs name the same one)."""
        path = urlsplit(amqp_nodes(self.amqp_url)[0]).path
        return unquote(path[1:]) if len(path) > 1 else "/"

    def archive_path(self) -> Path | str:
        """The archive's directory, or its ``s3://`` URL."""
        if self.archive_dir and self.archive_dir.startswith("s3://"):
            return self.archive_dir
        return Path(self.archive_dir) if self.archive_dir else \
            local_dir() / "archive" / self.namespace

    def secrets_path(self) -> Path:
        return Path(self.secrets_file or local_file(f"{self.namespace}.identities.json"))

    def identity(self, component: Component) -> Identity:
        """The component's own least-privileged identity: its ``CASETRAIL_<C>_*_URL``
        settings, else what ``casetrail setup`` wrote to the secrets file."""
        if component == "capability":
            raise PermanentError("a capability worker connects as the user of each capability "
                                 "it serves (capability_identity), never as one for all")
        configured = getattr(self, f"{component}_amqp_url")
        database = getattr(self, f"{component}_database_url", None)
        if configured is None or (database is None and component in DATABASE_COMPONENTS):
            stored = self.stored_secrets().get(component)
            if not isinstance(stored, dict) or "amqp_url" not in stored:
                raise PermanentError(
                    f"no identity for the {component}: set CASETRAIL_{component.upper()}_"
                    f"AMQP_URL (and _DATABASE_URL), or run `casetrail setup`, which writes "
                    f"them to {self.secrets_path().resolve()} (no .casetrail/ here or above: "
                    f"run from the project, or set CASETRAIL_HOME)")
            configured = configured or stored["amqp_url"]
            database = database or stored.get("database_url")
        # Never the bootstrap identity, nor another component's: consumers check
        # whose messages they take by these names.
        for url, expected in ((configured, self.broker_user(component)),
                              (database, self.database_role(component))):
            users = {unquote(urlsplit(u).username or "") for u in amqp_nodes(url)} \
                if url else {expected}
            user = ", ".join(sorted(users))
            if user != expected:
                raise PermanentError(
                    f"the {component} must connect as {expected!r}, not {user!r} (see "
                    "`casetrail setup`)")
        return Identity(component, configured, database)

    def audit_database_url(self) -> str:
        """The auditor's own login: ``CASETRAIL_AUDITOR_DATABASE_URL``, else what
        ``casetrail setup`` wrote to the secrets file; never the bootstrap URL."""
        url = self.auditor_database_url or (
            self.stored_secrets().get("auditor") or {}).get("database_url")
        if not url:
            raise PermanentError(
                "no identity for the auditor: set CASETRAIL_AUDITOR_DATABASE_URL, or run "
                f"`casetrail setup`, which writes it to {self.secrets_path().resolve()}")
        user = unquote(urlsplit(url).username or "")
        if user != self.database_role("auditor"):
            raise PermanentError(f"the auditor must connect as "
                                 f"{self.database_role('auditor')!r}, not {user!r} (see "
                                 "`casetrail setup`)")
        return str(url)

    def capability_identity(self, capability: str) -> Identity:
        """The broker identity of one capability: ``CASETRAIL_CAPABILITY_AMQP_URLS``'s
        entry, else what ``casetrail setup`` wrote to the secrets file."""
        url = self.capability_amqp_urls.get(capability)
        if url is None:
            stored = self.stored_secrets().get("capabilities", {}).get(capability, {})
            url = stored.get("amqp_url") if isinstance(stored, dict) else None
        if url is None:
            raise PermanentError(
                f"no identity for the capability {capability!r}: set its entry in "
                f"CASETRAIL_CAPABILITY_AMQP_URLS, or run `casetrail setup` (which gives each "
                f"capability it knows a user of its own, in {self.secrets_path()})")
        expected = self.capability_user(capability)
        users = {unquote(urlsplit(u).username or "") for u in amqp_nodes(url)}
        if users != {expected}:
            raise PermanentError(f"the capability {capability!r} must connect as "
                                 f"{expected!r}, not {', '.join(sorted(users))!r}")
        return Identity("capability", url, None)

    def capability_sealing_key(self, capability: str) -> str | None:
        """The capability's private sealing key (base64), from
        ``CASETRAIL_CAPABILITY_SEALING_KEYS`` or the secrets file; None when neither has
        one."""
        given = self.capability_sealing_keys.get(capability)
        if given is not None:
            return given.get_secret_value()
        stored = self.stored_secrets().get("capabilities", {}).get(capability, {})
        key = stored.get("sealing_key") if isinstance(stored, dict) else None
        return key if isinstance(key, str) else None

    def master_key_text(self) -> str:
        """The master key (``CASETRAIL_MASTER_KEY``, else the secrets file's)."""
        if self.master_key is not None:
            return self.master_key.get_secret_value()
        stored = self.stored_secrets().get("master_key")
        if not isinstance(stored, str):
            raise PermanentError(
                "no master key: set CASETRAIL_MASTER_KEY (base64 of 32 random bytes) or run "
                f"`casetrail setup`, which writes one to {self.secrets_path()}")
        return stored

    def stored_secrets(self) -> dict[str, Any]:
        """What ``casetrail setup`` wrote to the secrets file; empty when there is none."""
        try:
            stored = json.loads(self.secrets_path().read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise PermanentError(f"cannot read the secrets file {self.secrets_path()}: "
                                 f"{exc}") from None
        if not isinstance(stored, dict):
            raise PermanentError(f"the secrets file {self.secrets_path()} is not an object")
        return stored

    @model_validator(mode="after")
    def _a_database_of_its_own(self) -> Settings:
        """Without CASETRAIL_DATABASE_URL, the namespace's own database (named after it)."""
        if "database_url" not in self.model_fields_set:
            self.database_url = DEFAULT_DATABASE_SERVER + self.namespace
        return self

    def broker_user(self, component: Component) -> str:
        """The broker user a component's messages carry (``user_id``)."""
        return f"{self.namespace}-{component}"

    def capability_user(self, capability: str) -> str:
        """The broker user of one capability: the only one that reads its requests and
        whose replies to them a worker takes."""
        return f"{self.namespace}-capability-{capability}"

    def component_of(self, user: str | None) -> Component | None:
        """Which component a broker user is (every capability's user is a
        ``capability``), or None when it is none of this namespace's."""
        for component in COMPONENTS:
            if user == self.broker_user(component):
                return component
        prefix = f"{self.namespace}-capability-"
        if user and user.startswith(prefix) and re.match(CAPABILITY_NAME, user[len(prefix):]):
            return "capability"
        return None

    def database_role(self, component: Component | Literal["owner"]) -> str:
        return f"{self.namespace}_{component}"

    def origin(self) -> str:
        """The transparency log's origin (its checkpoints' first line, its key's name)."""
        return self.log_origin or f"casetrail/{self.namespace}"

    def quota(self, tenant: str) -> tuple[int, int]:
        """``(max active cases, max starts per minute)`` for ``tenant``."""
        override = self.tenant_quotas.get(tenant, TenantQuota())
        return (override.max_active_cases or self.tenant_max_active_cases,
                override.max_starts_per_minute or self.tenant_max_starts_per_minute)

    def review_policy(self, tenant: str) -> ReviewPolicy:
        """What ``tenant`` asks of the people deciding its cases."""
        policy = self.tenant_quotas.get(tenant)
        if policy is None:
            return ReviewPolicy()
        return ReviewPolicy(policy.review_every_case, policy.override_reviewers,
                            policy.review_deadline_seconds)

    def endpoint(self, name: str | None = None, *, provider: str | None = None,
                 base_url: str | None = None) -> ModelEndpoint | None:
        """The configured endpoint with this name, or serving ``provider`` at
        ``base_url``."""
        for entry in self.model_endpoints:
            if name is not None and entry.name == name:
                return entry
            if name is None and entry.provider == provider and base_url is not None \
                    and entry.base_url == base_url.rstrip("/"):
                return entry
        return None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
