"""The safety net for accepted cases nobody runs any more.

A case's start command is its one ticket to a worker: it is acked only once the case
ended, and it comes back when a worker dies or hands the case back. A broker that
loses it anyway (a node lost with unreplicated state, an operator's purge, a bug)
would leave the case ``running`` forever, its 202 unkept. So every worker runs a
sweeper, and one at a time sweeps (a Postgres advisory lock, taken per sweep, so
another worker takes over the moment this one dies): it finds cases that were
claimed, have not ended, and whose lease lapsed over a lease ago, and sends their
start command again. A copy too many is harmless: the claim decides (``ended``:
acked; a live lease elsewhere: waits without a slot; otherwise the next attempt,
resumed from the record). Each case is re-sent at most once a ``resend`` interval.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from casetrail.adapters.bus.publisher import Publisher
from casetrail.adapters.bus.start_commands import send_start
from casetrail.adapters.bus.topology import Topology
from casetrail.adapters.store import CaseStore
from casetrail.components.duties import Host
from casetrail.errors import CasetrailError
from casetrail.telemetry import metrics

log = logging.getLogger("casetrail.sweeper")


@dataclass
class StrandedCaseSweeper:
    """Re-sends the start command of stranded cases, every ``interval`` seconds."""

    store: CaseStore
    publisher: Publisher
    topology: Topology
    lease_seconds: float
    interval: float = 10.0

    @property
    def resend_seconds(self) -> float:
        """A case re-sent is not re-sent again before a worker had time to claim it."""
        return max(60.0, 4 * self.lease_seconds)

    async def sweep(self) -> int:
        """One sweep; the number of start commands sent again."""
        stranded = await self.store.take_stranded(
            f"{self.topology.namespace}.sweeper", self.lease_seconds, self.resend_seconds)
        for case_id, tenant_id, agent in stranded:
            log.warning("case %s is stranded (its lease lapsed, no terminal event, nobody "
                        "holds it): sending its start command again", case_id)
            await send_start(self.publisher, self.topology, case_id, tenant_id, agent)
            metrics.STRANDED_CASES_RESENT.inc()
        return len(stranded)

    async def run(self) -> None:
        """Sweep until cancelled; a failed sweep is logged and tried again next time
        (a case it marked but could not send is re-sent after ``resend_seconds``)."""
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.sweep()
            except CasetrailError as exc:
                log.warning("sweep for stranded cases failed: %s", exc)


def sweeping(interval: float) -> Callable[[Host], StrandedCaseSweeper]:
    """The sweeper as a worker's duty, a sweep every ``interval`` seconds."""
    return lambda host: StrandedCaseSweeper(host.store, host.publisher, host.topology,
                                            host.lease_seconds, interval)
