"""The worker's backtest runner (docs/backtests.md): takes the backtests people asked for
(``POST /backtests``, ``casetrail backtest``) one at a time under a lease, runs the
challenger over the selected recorded cases (service/audit/backtest.py), and keeps the
results with one signed record chained after the last (service/audit/backtest_record.py),
which the database puts in the transparency log. A runner that dies leaves its lease to
run out; the next takes the backtest over from the start (nothing of a run is kept
before its end), and a runner still alive stops at its next note of progress."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from casetrail.adapters.store import CaseStore
from casetrail.adapters.store.backtests import BacktestStore
from casetrail.adapters.store.ledger import LedgerStore
from casetrail.agents import challenger_of
from casetrail.agents.profile import AgentProfile
from casetrail.audit.backtest import (
    Budget,
    Run,
    challenger_model,
    records_verified,
    run_backtest,
    summary,
)
from casetrail.audit.backtest_record import record_body, result_digest
from casetrail.audit.evidence import Evidence
from casetrail.components.duties import Host
from casetrail.contract.events import ModelRef
from casetrail.contract.integrity import Signer
from casetrail.engine.chat import ChatModel
from casetrail.engine.tools import WorkerRuntime
from casetrail.errors import CasetrailError, TransientError

log = logging.getLogger("casetrail.backtests")

LEASE_SECONDS = 60.0
"""How long a runner holds a backtest without noting progress before another may take it."""


@dataclass
class BacktestRunner:
    backtests: BacktestStore
    cases: CaseStore
    evidence: Evidence
    """Checks each selected case's record: only those that verify are scored."""
    signer: Signer
    models: Callable[[ModelRef, AgentProfile], ChatModel]
    owner: str
    runtime: WorkerRuntime | None = None
    """What asks a read-only tool live (the tool policy ``live``); none: refused."""
    interval: float = 2.0
    lease_seconds: float = LEASE_SECONDS

    async def run(self) -> None:
        while True:
            try:
                if not await self.run_next():
                    await asyncio.sleep(self.interval)
            except CasetrailError as exc:
                log.warning("backtests: %s; tried again in %.0f s", exc, self.interval)
                await asyncio.sleep(self.interval)

    async def run_next(self) -> bool:
        """Run the next backtest waiting, if there is one."""
        row = await self.backtests.claim(self.owner, self.lease_seconds)
        if row is None:
            return False
        try:
            await self.run_claimed(row)
        except (LookupError, ValueError) as exc:
            await self.backtests.fail(row["backtest_id"], self.owner, str(exc))
        return True

    async def run_claimed(self, row: dict[str, Any]) -> None:
        """Run the backtest of ``row``, which this runner holds, and keep its record; stop
        at once (keeping nothing) when another runner took it over."""
        request, backtest_id = row["request"], row["backtest_id"]
        profile = challenger_of(request, row["agent"])
        ref = ModelRef.model_validate(request["model"]) if request.get("model") \
            else profile.default_model
        among = [uuid.UUID(c) for c in request["cases"]] if request.get("cases") else None
        since, until = (datetime.fromisoformat(request[k]) if request.get(k) else None
                        for k in ("since", "until"))
        ids = await self.cases.decided_cases(row["agent"], since, request["limit"],
                                             until=until, among=among, tenant=row["tenant_id"])
        done = 0

        def progressed(count: int, _: int) -> None:
            nonlocal done
            done = count

        running = asyncio.create_task(run_backtest(
            ids, self.cases.trails, profile, challenger_model(self.models, profile, ref),
            ref, Budget(request["concurrency"], request.get("maxTokens"),
                        request.get("maxSeconds")), records_verified(self.evidence), progressed,
            self.runtime if request.get("toolPolicy") == "live" else None))
        ran = await self._holding_lease(backtest_id, running, lambda: (done, len(ids)))
        if ran is None:
            return
        found = summary(ran.outcomes)
        results = found["results"]
        what = {
            "backtestId": str(backtest_id), "tenantId": row["tenant_id"],
            "agent": row["agent"],
            "championDigests": sorted({r["championDigest"] for r in results
                                       if r["championDigest"]}),
            "challenger": {"agent": profile.name, "version": profile.version,
                           "agentDigest": profile.digest,
                           "model": ref.model_dump(mode="json", by_alias=True,
                                                   exclude_none=True)},
            "selection": {"since": request.get("since"), "until": request.get("until"),
                          "limit": request["limit"], "picked": among is not None,
                          "casesListed": None if among is None else hashlib.sha256(
                              "\n".join(sorted(map(str, among))).encode()).hexdigest(),
                          "selected": len(ids), "leftOut": ran.left_out_json()},
            "toolPolicy": request.get("toolPolicy", "refuse"),
            "requestedBy": row["requested_by"], "requestedAt": row["requested_at"].isoformat(),
            "startedAt": row["started_at"].isoformat(),
            "finishedAt": datetime.now(UTC).isoformat(), "seconds": round(ran.seconds, 3),
            **({"stopped": ran.stopped} if ran.stopped else {})}
        body = record_body(what, found, results)
        kept = await self.backtests.keep(
            backtest_id, self.owner,
            [(uuid.UUID(r["caseId"]), r, result_digest(r)) for r in results],
            lambda prev: (body, self.signer.seal(prev, body)))
        if kept is None:
            log.warning("backtest %s was taken over by another runner: its run here is "
                        "dropped", backtest_id)
        else:
            log.info("backtest %s of %s: %d cases, record %s", backtest_id, row["agent"],
                     len(results), kept.hash[:16])

    async def _holding_lease(self, backtest_id: uuid.UUID, running: asyncio.Task[Run],
                             progress: Callable[[], tuple[int, int]]) -> Run | None:
        """``running``'s result, its lease held meanwhile by notes of ``progress()``
        (done, selected); ``None`` when another runner took the backtest over (the run
        is stopped at once). Any failure of a note but a transient one stops the run
        too, and is raised: a run without its lease is work nobody may keep."""
        pause = min(2.0, self.lease_seconds / 3)

        async def note() -> bool:
            """``True`` once the lease was lost."""
            while not running.done():
                try:
                    if not await self.backtests.progress(backtest_id, self.owner,
                                                         *progress(), self.lease_seconds):
                        running.cancel()  # its result could not be kept: no more work
                        return True
                except TransientError as exc:  # the lease may run out meanwhile: the
                    # next note finds whether another runner took it
                    log.warning("backtest %s: progress not noted (%s); noted again in "
                                "%.1f s", backtest_id, exc, pause)
                except Exception:
                    running.cancel()
                    raise
                await asyncio.sleep(pause)
            return False

        noting = asyncio.create_task(note())
        try:
            return await running
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if (task is not None and task.cancelling()) or not noting.done() \
                    or noting.cancelled():
                raise
            if (failed := noting.exception()) is not None:
                raise failed from None
            if noting.result():
                log.warning("backtest %s was taken over by another runner after %d of %d "
                            "cases: its run here stops", backtest_id, *progress())
                return None
            raise
        finally:
            noting.cancel()
            running.cancel()


def backtesting() -> Callable[[Host], BacktestRunner]:
    """The backtests runner as a worker's duty."""
    return lambda host: BacktestRunner(
        BacktestStore(host.store.pool), host.store,
        Evidence(host.store, host.keys, LedgerStore(host.store.pool)), host.signer, host.models,
        f"backtests:{host.owner}", host.runtime)
