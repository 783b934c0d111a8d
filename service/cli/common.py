"""What every ``casetrail`` command shares: how it runs its coroutine and how it logs."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Annotated, Any, TypeVar

import typer

from casetrail.components import gc_tuning
from casetrail.config import Settings, get_settings
from casetrail.telemetry import logs

T = TypeVar("T")

# What an offline check (``verify-bundle``, ``archive verify``) trusts: the auditor's
# word only, never the file's.
TrustLog = Annotated[list[str] | None, typer.Option(
    "--trust-log", help="The transparency log's verifier key (ORIGIN+HASH+KEY) or a "
    "file with one; then every event must be in a checkpoint it signed.")]
TrustWitness = Annotated[list[str] | None, typer.Option(
    "--trust-witness", help="A witness's verifier key (cosignature/v1) or a file with one; "
    "its cosignature is then required. Repeatable.")]
TrustAction = Annotated[list[str] | None, typer.Option(
    "--trust-action", help="An action key you trust (base64, or a trust file of such "
    "lines; repeatable): every person's action the trail records (reviews, answers) must "
    "be signed by one. Without it their signatures are not checked, and the report says "
    "so.")]
LogToday = Annotated[str | None, typer.Option(
    "--log", help="The log's base URL (the API's): also check that the log today still "
    "extends the checkpoint (nothing removed or rewritten since).")]


def run(main: Coroutine[Any, Any, T], *, long_running: bool = False) -> T:
    """Run ``main`` on uvloop where it is installed (a faster event loop, same
    semantics), else on asyncio's own. A long-running component first gets the garbage
    collector tuned for it (a short command would only pay for the freeze), and runs on
    asyncio's loop when ``CASETRAIL_EVENT_LOOP=asyncio`` says so."""
    if long_running:
        settings = get_settings()
        gc_tuning.tune(settings.gc_threshold)
        if settings.event_loop == "asyncio":
            return asyncio.run(main)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.run(main)
    return uvloop.run(main)


def configure_logging(level: str | None = None) -> None:
    settings = get_settings()
    logs.configure(level or settings.log_level, settings.log_format)


async def with_evidence(settings: Settings, work: Any) -> Any:
    """``work`` given the evidence of the database ``settings`` name (as the operator)."""
    from casetrail.adapters.store import CaseStore, KeyRegistry, create_pool
    from casetrail.adapters.store.ledger import LedgerStore
    from casetrail.audit.evidence import Evidence

    pool = await create_pool(settings.database_url, max_size=2)
    try:
        return await work(Evidence(CaseStore(pool), KeyRegistry(pool), LedgerStore(pool)))
    finally:
        await pool.close()
