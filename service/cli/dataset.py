"""``casetrail dataset export``: decided cases as an evaluation dataset, one JSONL line
a case (service/audit/dataset.py; docs/backtests.md, "Datasets")."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import orjson
import typer

from casetrail.cli.backtest import CasesFile, Since, Until, case_ids, instant_option
from casetrail.cli.common import run
from casetrail.config import get_settings

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
) -> None:
    """Write each decided case as a line of JSONL: input (sensitive values as their
    placeholders), the tool calls with their recorded results, the agent's answer
    (`output`), and for a reviewed case the reviewer's final decision
    (`expectedOutput`) and reason. Format: docs/dataset.schema.json. Exit 2 when no case
    matches."""
    settings = get_settings()
    start, end, among = instant_option(since, "--since"), instant_option(until, "--until"), \
        case_ids(cases)

    async def main() -> list[bytes]:
        from casetrail.adapters.store import CaseStore, create_pool
        from casetrail.audit.dataset import dataset_record
        from casetrail.audit.replay import recorded

        pool = await create_pool(settings.database_url, max_size=2)
        lines = []
        try:
            store = CaseStore(pool)
            ids = await store.decided_cases(agent, start, limit, until=end, among=among)
            for chunk in range(0, len(ids), 500):
                trails = await store.trails(ids[chunk:chunk + 500])
                for case_id in ids[chunk:chunk + 500]:
                    line = dataset_record(case_id, recorded(trails.get(case_id, [])))
                    if line is not None and (line["review"] or not reviewed_only):
                        lines.append(orjson.dumps(line) + b"\n")
        finally:
            await pool.close()
        return lines

    lines = run(main())
    if output is None:
        sys.stdout.buffer.write(b"".join(lines))
    else:
        output.write_bytes(b"".join(lines))
    typer.echo(f"{len(lines)} cases of {agent}", err=True)
    raise typer.Exit(0 if lines else 2)
