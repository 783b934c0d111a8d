"""What a worker hosts beside its cases (docs/design.md, "The house").

A worker runs cases: start commands, claims, leases, waits for people, resumption.
Beside them it hosts *duties*, each a loop of its own that runs until the worker stops:
the sweeper (stranded cases, service/components/sweeper.py), the retention pass (holds,
expiry, archives, partitions; service/components/retention.py) and the backtests runner
(service/components/backtests.py). A duty sees the worker only through ``Host``: what a
worker has that a duty may use. The worker knows none of them; the process that makes a
worker gives it its duties (``service/components/worker_duties.py``), and a test may
give it others.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from casetrail.adapters.bus.connection import BusConnection
from casetrail.adapters.bus.publisher import Publisher
from casetrail.adapters.bus.topology import Topology
from casetrail.adapters.store import CaseSecrets, CaseStore, KeyRegistry
from casetrail.agents.profile import AgentProfile
from casetrail.contract.events import Event, ModelRef
from casetrail.contract.integrity import Signer
from casetrail.engine.chat import ChatModel
from casetrail.engine.tools import WorkerRuntime


@dataclass(frozen=True)
class Host:
    """What a worker lends its duties."""

    owner: str
    """The worker's name (``host:pid:random``); a duty names its work after it."""
    connection: BusConnection
    publisher: Publisher
    topology: Topology
    store: CaseStore
    secrets: CaseSecrets
    keys: KeyRegistry
    """The registered signing keys."""
    signer: Signer
    append: Callable[[Event, str], Awaitable[None]]
    """The worker's signed append: the event, the hash it chains on."""
    action_keys: Callable[[], Awaitable[Mapping[str, Any]]]
    """The registered action keys, as the worker reads them (cached)."""
    models: Callable[[ModelRef, AgentProfile], ChatModel]
    runtime: WorkerRuntime
    lease_seconds: float


class Duty(Protocol):
    """A loop a worker hosts: ``run`` returns only when cancelled."""

    async def run(self) -> None: ...


Duties = Sequence[tuple[str, Callable[[Host], Duty]]]
"""A worker's duties: each one's name and how it is made from the host."""

