"""A rollout gate (docs/backtests.md, "A rollout gate"): an agent the operator names in
``CASETRAIL_BACKTEST_GATES`` takes no case until a backtest of its installed version
(the challenger's ``agentDigest``) agreed with the reviewers at least as often as the
operator asks. Only a record whose hash and signature verify under a registered signing
key counts: one written with a component's database credentials and no signing key opens
nothing. A pass is kept for the process's life; a miss is asked again after a few
seconds, so a backtest that passes opens the gate without a restart."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from casetrail.adapters.store import KeyRegistry
from casetrail.adapters.store.backtests import BacktestStore
from casetrail.agents.profile import AgentProfile
from casetrail.audit.backtest_record import seal_problems
from casetrail.cases.errors import Conflict

log = logging.getLogger("casetrail.gate")

MISS_SECONDS = 5.0
"""How long a gate found shut stays so before the database is asked again."""


@dataclass
class RolloutGate:
    gates: dict[str, float]
    _passed: set[tuple[str, str]] = field(default_factory=set)
    _missed: dict[tuple[str, str], float] = field(default_factory=dict)

    async def check(self, store: BacktestStore, keys: KeyRegistry, agent: AgentProfile,
                    tenant: str) -> None:
        """``Conflict`` naming the backtest the agent's version needs, unless it has one."""
        threshold = self.gates.get(agent.name)
        if threshold is None or (agent.digest, tenant) in self._passed:
            return
        key = (agent.digest, tenant)
        if time.monotonic() - self._missed.get(key, -MISS_SECONDS) >= MISS_SECONDS:
            if await _signed_pass(store, keys, agent.digest, threshold, tenant):
                self._passed.add(key)
                return
            self._missed[key] = time.monotonic()
        raise Conflict(
            f"agent {agent.name} {agent.version} (agentDigest {agent.digest}) takes cases "
            f"only after a backtest of this version agreed with the reviewers at least "
            f"{threshold:g} of the time, and none has: run POST /backtests with challenger "
            f"{agent.name}@{agent.version} over reviewed cases (docs/backtests.md)")


async def _signed_pass(store: BacktestStore, keys: KeyRegistry, digest: str, threshold: float,
                       tenant: str) -> bool:
    """Whether a record that passes is signed by a key registered (and still valid) when
    it was recorded; each one that does not verify is logged, and opens nothing."""
    candidates = await store.passing(digest, threshold, tenant)
    if not candidates:
        return False
    registered = await keys.all()
    for record in candidates:
        valid = {k.key_id: k.public_key for k in registered
                 if k.not_valid_after is None or record["recorded_at"] <= k.not_valid_after}
        problems = seal_problems(record, valid)
        if not problems:
            return True
        log.error("backtest %s's record names agentDigest %s as passing but does not "
                  "verify (%s): it opens no gate", record["backtest_id"], digest,
                  ", ".join(problems))
    return False
