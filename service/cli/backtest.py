"""``casetrail backtest``: how the agent's installed code, with a model of your choosing,
would have decided the cases already on file (service/audit/backtest.py). Nothing is
written and no tool is asked: the record answers, or the call is refused."""

from __future__ import annotations

import uuid
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer

from casetrail.cli.common import run
from casetrail.config import get_settings

Since = Annotated[str | None, typer.Option(
    help="Cases created at or after this RFC 3339 time.")]
Until = Annotated[str | None, typer.Option(help="Cases created before this RFC 3339 time.")]
CasesFile = Annotated[Path | None, typer.Option(
    "--cases", exists=True, dir_okay=False,
    help="Only these cases: a file of case ids, one a line.")]


def instant_option(text: str | None, option: str) -> datetime | None:
    from casetrail.cases.errors import Invalid
    from casetrail.cases.reading import instant

    try:
        return instant(text, option)
    except Invalid:
        typer.echo(f"{option} is not an RFC 3339 time with its offset: {text!r}", err=True)
        raise typer.Exit(2) from None


def case_ids(path: Path | None) -> list[uuid.UUID] | None:
    """The case ids in ``path``, one a line (blank lines and ``#`` comments skipped)."""
    if path is None:
        return None
    ids = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        try:
            ids.append(uuid.UUID(text))
        except ValueError:
            typer.echo(f"--cases {path}, line {number}: not a case id: {text!r}", err=True)
            raise typer.Exit(2) from None
    return ids


def _progress(done: int, total: int) -> None:
    if done == total or done % max(1, total // 10) == 0:
        typer.echo(f"backtest: {done} of {total} cases", err=True)


def backtest(
    agent: Annotated[str, typer.Option(help="The agent whose decided cases are run again.")],
    model: Annotated[str | None, typer.Option(help=(
        "The challenger's model, PROVIDER/NAME (default: the agent's own; scripted: its "
        "scripted brain)."))] = None,
    endpoint: Annotated[str | None, typer.Option(help=(
        "A configured model endpoint (CASETRAIL_MODEL_ENDPOINTS) for --model."))] = None,
    since: Since = None, until: Until = None, cases: CasesFile = None,
    limit: Annotated[int, typer.Option(min=1, help="At most this many cases.")] = 1000,
    concurrency: Annotated[int, typer.Option(min=1, max=256, help=(
        "Cases run at once."))] = 4,
    max_tokens: Annotated[int | None, typer.Option(min=1, help=(
        "Start no further case once the challenger has used this many tokens."))] = None,
    max_seconds: Annotated[float | None, typer.Option(min=0.001, help=(
        "Start no further case after this many seconds."))] = None,
    raw: Annotated[bool, typer.Option("--json", help="The whole comparison as JSON.")]
    = False,
) -> None:
    """Run a challenger over recorded cases: the agent's code as installed here, with
    --model, from each case's recorded input; a worker tool call the record holds is
    answered with its recorded result, any other is refused. Prints the decision matrix,
    agreement with reviewers and the cases whose decision changed. Exit 2 when there is
    nothing to run."""
    from casetrail.agents import AGENTS
    from casetrail.audit.backtest import Budget
    from casetrail.contract.events import ModelRef
    from casetrail.engine.scripted import ScriptedModel
    from casetrail.providers import ModelFactory, model_problem

    profile = AGENTS.get(agent)
    if profile is None:
        typer.echo(f"no agent {agent!r} here (agents: {', '.join(sorted(AGENTS))})", err=True)
        raise typer.Exit(2)
    settings = get_settings()
    ref = profile.default_model
    if model is not None:
        provider, _, name = model.partition("/")
        ref = ModelRef.model_validate({"provider": provider, "name": name,
                                       **({"endpoint": endpoint} if endpoint else {})})
    if problem := model_problem(ref, settings):
        typer.echo(f"--model: {problem[1]}", err=True)
        raise typer.Exit(2)
    start, end, among = instant_option(since, "--since"), instant_option(until, "--until"), \
        case_ids(cases)
    budget = Budget(concurrency, max_tokens, max_seconds)

    async def main() -> dict[str, Any]:
        from casetrail.adapters.store import CaseStore, create_pool
        from casetrail.audit.backtest import run_backtest, summary

        factory = ModelFactory(settings)
        chat = ScriptedModel(profile.script, name=ref.name) \
            if ref.provider == "scripted" and profile.script is not None \
            else factory(ref, profile)
        pool = await create_pool(settings.database_url, max_size=2)
        try:
            store = CaseStore(pool)
            ids = await store.decided_cases(agent, start, limit, until=end, among=among)
            done = await run_backtest(ids, store.trails, profile, chat, ref, budget,
                                      None if raw else _progress)
        finally:
            await pool.close()
            await factory.aclose()
        return {"agent": agent, "agentDigest": profile.digest,
                "challengerModel": ref.model_dump(mode="json", by_alias=True,
                                                  exclude_none=True),
                "selected": len(ids), "seconds": round(done.seconds, 3),
                **({"stopped": done.stopped} if done.stopped else {}),
                **summary(done.outcomes)}

    found = run(main())
    if raw:
        typer.echo(orjson.dumps(found, option=orjson.OPT_INDENT_2).decode())
    else:
        _print(found)
    raise typer.Exit(0 if found["cases"] else 2)


def _print(found: dict[str, Any]) -> None:
    typer.echo(f"{found['cases']} of {found['selected']} cases of {found['agent']} in "
               f"{found['seconds']} s, challenger "
               f"{found['challengerModel']['provider']}/{found['challengerModel']['name']}")
    if "stopped" in found:
        typer.echo(f"stopped early: {found['stopped']}")
    for cell in found["matrix"]:
        typer.echo(f"  {cell['champion']:>12} -> {cell['challenger']:<12} {cell['cases']}")
    agreed = found["agreementWithReviewers"]
    typer.echo(f"reviewed {found['reviewed']}: agreement with reviewers, champion "
               f"{agreed['champion']}, challenger {agreed['challenger']}")
    typer.echo(f"changed {len(found['changed'])}; calls the record could not answer "
               f"{found['unansweredCalls']}; tokens {found['tokens']}")
    for result in found["results"]:
        if result["changed"] or result.get("problem"):
            typer.echo(f"  {result['caseId']}: {result['champion']} -> "
                       f"{result['challenger']}" + (f" ({result['problem']})"
                                                    if result.get("problem") else ""))
