"""Backtests as people ask for and read them (docs/backtests.md): ``POST /backtests`` and
``casetrail backtest`` keep the request, a worker runs it (service/components/backtests.py),
``GET /backtests/{id}`` shows its progress and, once done, the signed record's summary
and every per-case result; ``/bundle`` is the offline evidence of it.

Asking needs ``backtests:run``; reading needs ``cases:read`` (or ``backtests:run``). A
tenant's caller asks over, and sees, its own tenant's cases only."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import orjson

from casetrail.agents import AGENTS, challenger_of
from casetrail.audit.backtest_record import bundle, verify_backtest_bundle
from casetrail.cases.errors import (
    Conflict,
    Forbidden,
    Invalid,
    Issue,
    NotFound,
    NotInstalled,
    NotYet,
)
from casetrail.cases.services import CaseServices
from casetrail.cases.text import refuse_unstorable
from casetrail.contract.auth import EVERY_TENANT, Principal, Scope
from casetrail.contract.events import new_case_id
from casetrail.extras import missing
from casetrail.ledger.note import TlogProof
from casetrail.providers import model_problem
from casetrail.trail.verification import checked_at


def _reads(principal: Principal) -> None:
    if not (principal.allows(Scope.READ) or principal.allows(Scope.BACKTESTS)):
        raise Forbidden("reading backtests needs 'cases:read' or 'backtests:run'")


async def ask(services: CaseServices, principal: Principal, asked: dict[str, Any]
              ) -> dict[str, Any]:
    """Keep a backtest for a worker to run (``asked``: a ``BacktestRequest`` as JSON)."""
    if not principal.allows(Scope.BACKTESTS):
        raise Forbidden("running a backtest needs the scope 'backtests:run'")
    refuse_unstorable(asked, "body")
    agent = asked["agent"]
    if agent not in AGENTS:
        raise Invalid(Issue(("body", "agent"), f"no agent {agent!r} is installed (agents: "
                            f"{', '.join(sorted(AGENTS))})"))
    try:
        profile = challenger_of(asked, agent)
    except LookupError as exc:
        raise Invalid(Issue(("body", "challenger"), str(exc))) from None
    if asked.get("model") is not None:
        from casetrail.contract.events import ModelRef

        if problem := model_problem(ModelRef.model_validate(asked["model"]), services.settings):
            raise Invalid(Issue(("body", "model", problem[0]), problem[1]))
    asked = {**asked, "challenger": f"{profile.name}@{profile.version}"}
    tenant = None if principal.tenant == EVERY_TENANT else principal.tenant
    row = await services.backtests.ask(new_case_id(), tenant, agent, asked,
                                       principal.person or principal.subject)
    return _view(row)


async def recent(services: CaseServices, principal: Principal, limit: int
                 ) -> dict[str, Any]:
    _reads(principal)
    tenant = None if principal.tenant == EVERY_TENANT else principal.tenant
    return {"backtests": [_view(r) for r in await services.backtests.recent(tenant, limit)]}


async def _owned(services: CaseServices, principal: Principal, backtest_id: uuid.UUID
                 ) -> dict[str, Any]:
    _reads(principal)
    row = await services.backtests.get(backtest_id)
    if row is None or not ((row["tenant_id"] is None and principal.tenant == EVERY_TENANT)
                           or (row["tenant_id"] is not None and principal.sees(row["tenant_id"]))):
        raise NotFound(f"no backtest {backtest_id}")
    return row


async def show(services: CaseServices, principal: Principal, backtest_id: uuid.UUID
               ) -> dict[str, Any]:
    """Its progress; once done, what its signed record says and every result."""
    row = await _owned(services, principal, backtest_id)
    view = _view(row)
    record = await services.backtests.record(backtest_id)
    if record is not None:
        signed = orjson.loads(record["body"])
        leaves = await services.ledger.leaves_of_case(backtest_id)
        view |= {"record": {"hash": record["hash"], "prevHash": record["prev_hash"],
                            "keyId": record["key_id"], "chainSeq": record["chain_seq"],
                            "leafIndex": leaves.get(backtest_id),
                            "recordedAt": record["recorded_at"].isoformat()},
                 "championDigests": signed["championDigests"],
                 "challenger": signed["challenger"], "selection": signed["selection"],
                 "seconds": signed["seconds"],
                 **({"stopped": signed["stopped"]} if "stopped" in signed else {}),
                 "summary": signed["summary"],
                 "results": await services.backtests.results(backtest_id)}
    return view


async def evidence(services: CaseServices, principal: Principal, backtest_id: uuid.UUID
                   ) -> dict[str, Any]:
    """The backtest's offline bundle (service/audit/backtest_record.py)."""
    row = await _owned(services, principal, backtest_id)
    record = await services.backtests.record(backtest_id)
    if record is None:
        raise Conflict(f"backtest {backtest_id} has no record yet: it is {row['status']}")
    proof, log = None, None
    latest = await services.ledger.latest()
    index = (await services.ledger.leaves_of_case(backtest_id)).get(backtest_id)
    if latest is not None:
        log = {"checkpoint": latest.served,
               "verifierKeys": await services.ledger.verifier_keys()}
        if index is not None and index < latest.size:
            [path] = await services.ledger.inclusions([index], latest.size)
            proof = TlogProof(index, tuple(path), latest.served).render()
    if proof is None:  # never handed out without the proof that it is in the log
        raise NotYet(f"backtest {backtest_id}'s record is not in a signed checkpoint yet ("
                     + ("waiting for the ledger" if index is None else f"leaf {index}")
                     + "): its bundle is handed out with its log proof; ask again in a few "
                     "seconds")
    return bundle(record, await services.backtests.results(backtest_id),
                  await services.evidence.keys.describe(), proof, log, checked_at())


async def report(services: CaseServices, principal: Principal, backtest_id: uuid.UUID
                 ) -> tuple[bytes, str]:
    """The backtest's PDF for the validation file and the SHA-256 of the bundle it embeds,
    its verdict taken under the registered signing keys."""
    found = await evidence(services, principal, backtest_id)
    if why := missing("pdf"):
        raise NotInstalled(why)
    from casetrail.audit.backtest_report import render_backtest

    keys = [k.public_key for k in await services.evidence.keys.all()]
    verdict = verify_backtest_bundle(found, keys)
    return await asyncio.to_thread(render_backtest, found, verdict.as_json())


def _view(row: dict[str, Any]) -> dict[str, Any]:
    def at(name: str) -> str | None:
        return None if row[name] is None else row[name].isoformat()

    return {"backtestId": str(row["backtest_id"]), "agent": row["agent"],
            "status": row["status"], "requestedBy": row["requested_by"],
            "requestedAt": at("requested_at"), "startedAt": at("started_at"),
            "finishedAt": at("finished_at"),
            "progress": {"done": row["cases_done"], "selected": row["cases_selected"]},
            **({"problem": row["problem"]} if row["problem"] else {}),
            "request": row["request"]}
