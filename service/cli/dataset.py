"""``casetrail dataset export``: decided cases as an evaluation dataset, one JSONL line
a case (service/audit/dataset.py; docs/backtests.md, "Datasets")."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer

from casetrail.cli.backtest import CasesFile, Since, Until, case_ids, instant_option
from casetrail.cli.cases import ApiKey, perform
from casetrail.cli.common import run
from casetrail.config import get_settings
from casetrail.contract.auth import Scope

dataset_app = typer.Typer(no_args_is_help=True, rich_markup_mode="markdown", help=(
    "Evaluation datasets from the record."))


@dataset_app.command("export")
def export(
    agent: Annotated[str, typer.Option(help="The agent whose decided cases are exported.")],
    reviewed_only: Annotated[bool, typer.Option(
        "--reviewed-only", help="Only cases a person reviewed (they carry a label).")]
    = False,
    since: Since = None, until: Until = None, cases: CasesFile = None,
    limit: Annotated[int, typer.Option(min=1, help="At most this many cases.")] = 100_000,
    output: Annotated[Path | None, typer.Option(
        "--output", "-o", help="Write here (default: standard output).")] = None,
    personal_data: Annotated[bool, typer.Option(
        "--personal-data", help=(
            "Sensitive input values in clear, for a caller with pii:read (the operator, or "
            "--api-key): each case's read is logged in access_log. A dataset is copied "
            "where erasure cannot follow: without it, values stay placeholders."))] = False,
    api_key: ApiKey = None,
) -> None:
    """Write each decided case as a line of JSONL: input (sensitive values as their
    placeholders, unless --personal-data), the tool calls with their recorded results,
    the agent's answer (`output`), and for a reviewed case the reviewer's final decision
    (`expectedOutput`) and reason. Format: docs/dataset.schema.json. Exit 2 when no case
    matches."""
    settings = get_settings()
    start, end, among = instant_option(since, "--since"), instant_option(until, "--until"), \
        case_ids(cases)

    async def lines_of(store: Any, tenant: str | None,
                       opened: Callable[[uuid.UUID], Awaitable[dict[str, str]]] | None
                       ) -> list[bytes]:
        from casetrail.audit.dataset import dataset_record
        from casetrail.audit.replay import recorded
        from casetrail.privacy.sensitive import restore

        lines = []
        ids = await store.decided_cases(agent, start, limit, until=end, among=among,
                                        tenant=tenant)
        for chunk in range(0, len(ids), 500):
            trails = await store.trails(ids[chunk:chunk + 500])
            for case_id in ids[chunk:chunk + 500]:
                line = dataset_record(case_id, recorded(trails.get(case_id, [])))
                if line is None or not (line["review"] or not reviewed_only):
                    continue
                if opened is not None:
                    line = {**line, "input": restore(line["input"], await opened(case_id))}
                lines.append(orjson.dumps(line) + b"\n")
        return lines

    async def main() -> list[bytes]:
        from casetrail.adapters.store import CaseStore, create_pool

        pool = await create_pool(settings.database_url, max_size=2)
        try:
            return await lines_of(CaseStore(pool), None, None)
        finally:
            await pool.close()

    async def in_clear(services: Any, principal: Any) -> list[bytes]:
        from casetrail.cases.reading import sensitive_values
        from casetrail.contract.auth import EVERY_TENANT

        async def opened(case_id: uuid.UUID) -> dict[str, str]:
            row = await services.store.get_case(case_id)
            return {} if row is None else (await sensitive_values(services, principal,
                                                                  row))[0]

        return await lines_of(services.store, None if principal.tenant == EVERY_TENANT
                              else principal.tenant, opened)

    lines = perform(api_key, Scope.PII_READ, None, in_clear) if personal_data else run(main())
    if output is None:
        sys.stdout.buffer.write(b"".join(lines))
    else:
        output.write_bytes(b"".join(lines))
    typer.echo(f"{len(lines)} cases of {agent}", err=True)
    raise typer.Exit(0 if lines else 2)
