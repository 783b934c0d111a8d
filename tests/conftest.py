"""Test fixtures: a private database and a private bus namespace per test session,
on the real Postgres and the real RabbitMQ, dropped afterwards.

A guard makes any name lookup of a non-local host fail, so no test can reach a
real LLM provider (or anything else off this machine).
"""

from __future__ import annotations

import os
import socket
import tempfile
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from casetrail.adapters.bus import fastpath
from casetrail.adapters.bus.topology import Topology
from casetrail.config import Settings, TenantQuota
from casetrail.contract.integrity import Signer
from casetrail.ledger.log_key import write_log_key
from casetrail.ledger.note import NoteSigner
from casetrail.trail.keyfile import worker_signer, write_signer

# A stack's files (keys, secrets) default to the user's configuration directory: the
# tests' own, so that no test reads or leaves anything in the real one.
os.environ["XDG_CONFIG_HOME"] = tempfile.mkdtemp(prefix="casetrail-tests-config-")

_LOCAL = {"localhost", "127.0.0.1", "::1", "0.0.0.0", ""}
_real_getaddrinfo = socket.getaddrinfo


BLOCKED_HOSTS: list[str] = []
"""Hosts a test tried to reach; any entry fails that test (see ``_no_outside_hosts``)."""


def _guarded_getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
    name = host.decode() if isinstance(host, bytes) else (host or "")
    if name not in _LOCAL and not name.startswith("127."):
        BLOCKED_HOSTS.append(name)
        raise socket.gaierror(f"tests must not reach {name!r}: only this machine is allowed")
    return _real_getaddrinfo(host, *args, **kwargs)


socket.getaddrinfo = _guarded_getaddrinfo


@pytest.fixture(autouse=True)
def _no_outside_hosts() -> Iterator[None]:
    """Fail any test that tried to reach a host off this machine (a real provider)."""
    yield
    tried = list(BLOCKED_HOSTS)
    BLOCKED_HOSTS.clear()
    assert not tried, f"a test tried to reach {tried}"


BASE_AMQP = os.environ.get("CASETRAIL_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
BASE_DB = os.environ.get("CASETRAIL_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/casetrail")


LOG_ORIGIN = "casetrail.test/log"
"""The tests' transparency log (one key for every namespace the tests make)."""


@pytest.fixture(scope="session")
def settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    suffix = uuid.uuid4().hex[:8]
    db_url = BASE_DB.rsplit("/", 1)[0] + f"/casetrail_test_{suffix}"
    key_file = tmp_path_factory.mktemp("keys") / "worker-signing-key.pem"
    write_signer(key_file, Signer.generate())  # the tests make their own keys
    namespace = f"casetrail-test-{suffix}"
    action_key = key_file.parent / "api-action-key.pem"
    write_signer(action_key, Signer.generate())  # the API's: it signs persons' actions
    audit_key = key_file.parent / "auditor-key.pem"
    write_signer(audit_key, Signer.generate())  # the auditor's: it signs each pass it keeps
    log_key = key_file.parent / "log-key"
    write_log_key(log_key, NoteSigner.generate(LOG_ORIGIN))
    return Settings(
        amqp_url=BASE_AMQP,
        database_url=db_url,
        namespace=namespace,
        log_key_file=str(log_key),
        log_origin=LOG_ORIGIN,
        checkpoint_seconds=0.2,
        consumer_linger_ms=2.0,
        lease_seconds=3.0,
        tool_timeout_seconds=2.0,
        signing_key_file=str(key_file),
        action_key_file=str(action_key),
        audit_key_file=str(audit_key),
        secrets_file=str(key_file.parent / "identities.json"),
        bench_mode=True,  # the tests use slow scripted models (latencyMs)
        # Any free port for each component's metrics: beside a demo stack, and beside
        # each other (the tests start several of each).
        api_metrics_port=0, worker_metrics_port=0, consumer_metrics_port=0,
        capability_metrics_port=0, ledger_metrics_port=0,
        # The suite starts many cases in a minute as one tenant (schemathesis alone
        # hundreds); two tenants keep small limits for the quota tests.
        tenant_max_starts_per_minute=100_000, tenant_max_key_searches_per_minute=100_000,
        # One key reads many streams at once in the stream tests (the per-key limit has
        # its own test, on an API with a limit of 2).
        stream_max_per_key=200,
        # The tests' own capabilities, beside the agents': a queue and a user each.
        extra_capabilities=["nobody-home", "slow-echo"],
        tenant_quotas={"tiny": TenantQuota(max_active_cases=1),
                       "hasty": TenantQuota(max_starts_per_minute=2),
                       "a2a-hasty": TenantQuota(max_starts_per_minute=1)},
    )


@pytest.fixture(scope="session")
def signer(settings: Settings) -> Signer:
    """The worker's key in these tests (registered in the test database by ``pool``)."""
    return worker_signer(settings)


@pytest.fixture(scope="session")
def topology(settings: Settings) -> Topology:
    return Topology(settings.namespace)


@pytest.fixture(scope="session", autouse=True)
def _amqp_fastpath(settings: Settings) -> None:
    """In-process components take the fast path as the real ones do, unless the run
    says ``CASETRAIL_AMQP_FASTPATH=off`` (``make test`` runs the bus tests both ways)."""
    fastpath.enable(settings.amqp_fastpath)
