"""Erasing a case's sensitive values: one procedure for ``POST /cases/{id}/erase`` and
``casetrail erase``. Postgres first (the key and ciphertext destroyed, who and when
kept, the act logged), then the erase command, on which the worker appends the signed
``CASE_ERASED`` to the trail (only the worker signs events)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from casetrail.adapters.bus.journal import journal
from casetrail.adapters.bus.publisher import Publisher
from casetrail.adapters.bus.topology import Topology
from casetrail.adapters.store import CaseSecrets
from casetrail.adapters.store.pool import HeldByLaw
from casetrail.contract.commands import EraseCommand
from casetrail.contract.events import ENDED_STATUSES


@dataclass(frozen=True)
class Erasure:
    outcome: Literal["erased", "already", "nothing", "running", "held"]
    erased_at: datetime | None = None


async def erase(secrets: CaseSecrets, publisher: Publisher, topology: Topology,
                case: dict[str, Any], by: str) -> Erasure:
    """Erase ``case`` (its ``cases`` row) for ``by``. ``running``: not ended yet, nothing
    done; ``held``: a legal hold keeps its values (the database refused); ``nothing``: it
    holds no sensitive values; ``already``: done before (the command is sent again,
    harmlessly, in case the first was lost)."""
    case_id: uuid.UUID = case["case_id"]
    if case["status"] not in ENDED_STATUSES:
        return Erasure("running")
    if await secrets.held(case_id, case["tenant_id"]):
        return Erasure("held")
    await journal(publisher, topology, {"kind": "erasure", "caseId": str(case_id),
                                        "tenantId": case["tenant_id"], "by": by})
    try:
        outcome, erased_at = await secrets.erase(case_id, by)
    except HeldByLaw:
        return Erasure("held")
    if outcome == "nothing":
        return Erasure("nothing")
    if outcome == "erased":
        await secrets.log_access(by, case["tenant_id"], case_id, "erase")
    await publisher.publish(
        topology.commands_exchange, Topology.ERASE_KEY,
        EraseCommand(case_id=case_id, tenant_id=case["tenant_id"]).to_json(),
        message_type=EraseCommand.MESSAGE_TYPE, correlation_id=str(case_id),
        message_id=f"erase-{case_id}")
    return Erasure(outcome, erased_at)
