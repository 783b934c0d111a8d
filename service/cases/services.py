"""What the case operations work with: the store, the search index, the vault, the
evidence, the publisher. Opened once by the API (for its lifetime) or by a CLI command
(for one operation), as the API's own identity either way."""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from limits import RateLimitItemPerMinute
from limits.storage import MemoryStorage
from limits.strategies import MovingWindowRateLimiter

from casetrail.adapters.bus import fastpath
from casetrail.adapters.bus.connection import BusConnection, connect_patiently
from casetrail.adapters.bus.publisher import Publisher
from casetrail.adapters.bus.topology import Topology
from casetrail.adapters.store import (
    CaseSecrets,
    CaseStore,
    KeyRegistry,
    component_pool,
    tenant_counts,
)
from casetrail.adapters.store.backtests import BacktestStore
from casetrail.adapters.store.batching import Coalescer
from casetrail.adapters.store.ledger import LedgerStore
from casetrail.adapters.store.pool import Pool
from casetrail.adapters.store.retention import RetentionStore
from casetrail.adapters.store.search import CaseIndex
from casetrail.agents import AGENTS, CAPABILITIES
from casetrail.audit.evidence import Evidence
from casetrail.cases.configured import described, misconfigured
from casetrail.cases.gate import RolloutGate
from casetrail.config import Settings
from casetrail.contract.integrity import Signer
from casetrail.errors import CasetrailError
from casetrail.privacy.sensitive import Vault
from casetrail.trail.keyfile import action_signer

log = logging.getLogger("casetrail.cases")

QUOTA_REFRESH_SECONDS = 0.25
"""How long an API process counts a tenant's starts itself before asking Postgres again."""


@dataclass
class TenantLoad:
    """A tenant's cases as Postgres last counted them, plus this process's admissions."""

    fetched_at: float
    active: int
    recent: int

    def admitted(self) -> None:
        self.active += 1
        self.recent += 1


@dataclass
class TenantLoads:
    """Per-tenant counts behind the quotas, read from Postgres at most every quarter
    second and counted up here between reads: a quota check costs a dictionary lookup,
    not a query. Another API process's starts are seen at the next read, so tenants
    can exceed a limit by what the other processes admit in that quarter second."""

    count: Callable[[str, int, int], Awaitable[tuple[int, int]]]
    _loads: dict[str, TenantLoad] = field(default_factory=dict)

    async def load(self, tenant: str, max_active: int, max_per_minute: int) -> TenantLoad:
        now = time.monotonic()
        load = self._loads.get(tenant)
        if load is None or now - load.fetched_at > QUOTA_REFRESH_SECONDS:
            active, recent = await self.count(tenant, max_active, max_per_minute)
            load = self._loads[tenant] = TenantLoad(now, active, recent)
        return load


class KeySearches:
    """Each tenant's searches by business key within a moving minute, in this process."""

    def __init__(self, per_minute: int) -> None:
        self._limiter = MovingWindowRateLimiter(MemoryStorage())
        self._item = RateLimitItemPerMinute(per_minute)

    def admit(self, tenant: str) -> int | None:
        """``None`` when the tenant may search now (counted), else seconds to wait."""
        if self._limiter.hit(self._item, tenant):
            return None
        reset = self._limiter.get_window_stats(self._item, tenant).reset_time
        return max(1, math.ceil(reset - time.time()))


@dataclass
class CaseServices:
    """The adapters the operations use (service/cases/)."""

    settings: Settings
    pool: Pool
    connection: BusConnection
    publisher: Publisher
    topology: Topology
    store: CaseStore
    index: CaseIndex
    secrets: CaseSecrets
    ledger: LedgerStore
    evidence: Evidence
    quotas: TenantLoads
    confirmed_starts: Coalescer[uuid.UUID, Any]
    key_searches: KeySearches
    """Each tenant's searches by business key this minute (CASETRAIL_TENANT_MAX_KEY_
    SEARCHES_PER_MINUTE)."""
    action_signer: Signer | None = None
    """The API's action key (CASETRAIL_ACTION_KEY_FILE): it signs every action of a
    person's it keeps; without one, no such action is kept."""
    unconfigured: dict[str, list[str]] = field(default_factory=dict)
    """Each agent that cannot run as this deployment is configured, with its reasons
    (service/cases/configured.py): a case for it is refused, naming them."""
    gate: RolloutGate = field(default_factory=lambda: RolloutGate({}))
    """The agents that take cases only after a passed backtest (CASETRAIL_BACKTEST_GATES)."""
    _noting: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def retention(self) -> RetentionStore:
        """Policies, business dates and legal holds (service/cases/retention.py)."""
        return RetentionStore(self.pool)

    @property
    def backtests(self) -> BacktestStore:
        """Backtests asked for, their results and records (service/cases/backtests.py)."""
        return BacktestStore(self.pool)

    def note_start_confirmed(self, case_id: uuid.UUID) -> None:
        """Record, off the request's path, that the broker confirmed a start command (a
        note lost is harmless: a re-sent request may then publish one more copy)."""
        async def note() -> None:
            try:
                await self.confirmed_starts(case_id)
            except CasetrailError as exc:
                log.warning("could not note the start of %s as confirmed: %s", case_id, exc)

        task = asyncio.create_task(note())
        self._noting.add(task)
        task.add_done_callback(self._noting.discard)

    async def settle(self) -> None:
        """Wait (a little) for the notes still being written."""
        if self._noting:
            await asyncio.wait(self._noting, timeout=5)


@asynccontextmanager
async def case_services(settings: Settings, *, pool_size: int = 20, patience: float | None = None,
                        name: str = "casetrail-api") -> AsyncIterator[CaseServices]:
    """The services, as the API's identity, until the block ends. ``patience``: how long
    to wait for Postgres (None: as long as it takes, as a long-running API does)."""
    fastpath.enable(settings.amqp_fastpath)
    identity = settings.identity("api")
    pool = await component_pool(identity, pool_size, patience)
    try:
        connection = await connect_patiently(identity.amqp_url, name, **(
            {} if patience is None else {"patience": patience}))
        try:
            topology = Topology(settings.namespace)
            channel = await connection.channel()
            await topology.require(channel)
            await channel.close()
            # A short retry, and a nack (a full start queue, a queue between leaders)
            # answered at once: a client waiting on a start is better served by a
            # prompt refusal than by a minute of silence.
            publisher = await Publisher.open(connection, retry_seconds=3.0, retry_nacks=False)
            store, ledger = CaseStore(pool), LedgerStore(pool)
            secrets = CaseSecrets(pool, Vault.from_text(settings.master_key_text()))
            await secrets.check_master_key()
            services = CaseServices(
                settings, pool, connection, publisher, topology, store, CaseIndex(pool),
                secrets, ledger,
                Evidence(store, KeyRegistry(pool), ledger),
                TenantLoads(lambda *args: tenant_counts(pool, *args)),
                Coalescer(store.mark_starts_confirmed),
                KeySearches(settings.tenant_max_key_searches_per_minute),
                action_signer(settings) if settings.action_key_file else None,
                misconfigured(AGENTS, settings, CAPABILITIES),
                RolloutGate(dict(settings.backtest_gates),
                            settings.backtest_gate_min_reviewed))
            for agent, problems in services.unconfigured.items():
                log.error("%s", described(agent, problems))
            try:
                yield services
            finally:
                await services.settle()
        finally:
            await connection.close()
    finally:
        await pool.close()
