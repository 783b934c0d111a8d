"""A rollout gate (docs/backtests.md, "A rollout gate"): an agent the operator names in
``CASETRAIL_BACKTEST_GATES`` takes no case until a backtest of its installed version
(the challenger's ``agentDigest``) agreed with the reviewers at least as often as the
operator asks, on a selection nobody picked (a window, or all its decided cases; never a
list of cases) holding at least ``CASETRAIL_BACKTEST_GATE_MIN_REVIEWED`` reviewed cases.
Only a record whose hash and signature verify under a registered signing key counts,
read from its signed bytes: one written with a component's database credentials and no
signing key opens nothing. A pass is kept for the process's life; a miss is asked again
after a few seconds, so a backtest that passes opens the gate without a restart."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from casetrail.adapters.store import KeyRegistry
from casetrail.adapters.store.backtests import BacktestStore
from casetrail.agents.profile import AgentProfile
from casetrail.audit.backtest_record import seal_problems
from casetrail.cases.errors import Conflict
from casetrail.config import Settings

log = logging.getLogger("casetrail.gate")

MISS_SECONDS = 5.0
"""How long a gate found shut stays so before the database is asked again."""


MIN_REVIEWED: int = Settings.model_fields["backtest_gate_min_reviewed"].default
"""Reviewed cases a backtest must hold to open a gate, by default."""


def why_shut(signed: Any, threshold: float, min_reviewed: int) -> str | None:
    """Why a backtest's signed record (its body, parsed) opens no gate, or ``None``: it
    must hold a selection nobody picked (no list of cases: a window, or all the agent's
    decided cases), at least ``min_reviewed`` reviewed cases, and an agreement with the
    reviewers of at least ``threshold``."""
    try:
        selection, summary = signed["selection"], signed["summary"]
        picked = selection.get("casesListed") is not None or selection.get("picked", False)
        reviewed = int(summary["reviewed"])
        agreement = summary["agreementWithReviewers"]["challenger"]
    except (KeyError, TypeError, ValueError, AttributeError):
        return "it does not say its selection, its reviewed cases and its agreement"
    if picked:
        return "its cases were picked by who asked for it (a list)"
    if reviewed < min_reviewed:
        return f"it holds {reviewed} reviewed cases, fewer than {min_reviewed}"
    if not isinstance(agreement, int | float) or agreement < threshold:
        return f"its agreement with the reviewers is below {threshold:g}"
    return None


@dataclass
class RolloutGate:
    gates: dict[str, float]
    min_reviewed: int = MIN_REVIEWED
    """Reviewed cases a backtest must hold to open a gate (on a selection nobody picked)."""
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
            if await _signed_pass(store, keys, agent.digest, threshold, tenant,
                                  self.min_reviewed):
                self._passed.add(key)
                return
            self._missed[key] = time.monotonic()
        raise Conflict(
            f"agent {agent.name} {agent.version} (agentDigest {agent.digest}) takes cases "
            f"only after a backtest of this version agreed with the reviewers at least "
            f"{threshold:g} of the time on at least {self.min_reviewed} reviewed cases of a "
            f"selection nobody picked (a time window, or all its decided cases; never a "
            f"list), and none has: run POST /backtests with challenger "
            f"{agent.name}@{agent.version} (docs/backtests.md, \"A rollout gate\")")


async def _signed_pass(store: BacktestStore, keys: KeyRegistry, digest: str, threshold: float,
                       tenant: str, min_reviewed: int) -> bool:
    """Whether a record that passes is signed by a key registered (and still valid) when
    it was recorded, and passes on its signed bytes (``why_shut``); each one that does
    not verify is logged, and opens nothing."""
    candidates = await store.passing(digest, threshold, tenant)
    if not candidates:
        return False
    registered = await keys.all()
    for record in candidates:
        valid = {k.key_id: k.public_key for k in registered
                 if k.not_valid_after is None or record["recorded_at"] <= k.not_valid_after}
        problems = seal_problems(record, valid)
        if not problems:
            why = why_shut(orjson.loads(bytes(record["body"])), threshold, min_reviewed)
            if why is None:
                return True
            log.info("backtest %s names agentDigest %s but opens no gate: %s",
                     record["backtest_id"], digest, why)
            continue
        log.error("backtest %s's record names agentDigest %s as passing but does not "
                  "verify (%s): it opens no gate", record["backtest_id"], digest,
                  ", ".join(problems))
    return False
