"""``casetrail backtest``: how the agent's installed code, with a model of your choosing,
would have decided the cases already on file (service/audit/backtest.py). Nothing is
written and no tool is asked: the record answers, or the call is refused."""

from __future__ import annotations

import uuid
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer

from casetrail.cli.cases import ApiKey
from casetrail.cli.common import run
from casetrail.config import get_settings


class ToolPolicy(StrEnum):
    REFUSE = "refuse"
    LIVE = "live"


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
    challenger: Annotated[str | None, typer.Option(help=(
        "An installed agent, NAME or NAME@VERSION (default: the agent as installed)."))]
    = None,
    model: Annotated[str | None, typer.Option(help=(
        "The challenger's model, PROVIDER/NAME (default: the agent's own; scripted: its "
        "scripted brain)."))] = None,
    endpoint: Annotated[str | None, typer.Option(help=(
        "A configured model endpoint (CASETRAIL_MODEL_ENDPOINTS) for --model."))] = None,
    since: Since = None, until: Until = None, cases: CasesFile = None,
    limit: Annotated[int, typer.Option(min=1, max=100_000, help="At most this many cases.")]
    = 1000,
    concurrency: Annotated[int, typer.Option(min=1, max=64, help=(
        "Cases run at once."))] = 4,
    max_tokens: Annotated[int | None, typer.Option(min=1, help=(
        "Start no further case once the challenger has used this many tokens."))] = None,
    max_seconds: Annotated[float | None, typer.Option(min=0.001, help=(
        "Start no further case after this many seconds."))] = None,
    tool_policy: Annotated[ToolPolicy, typer.Option(help=(
        "A worker tool call the record lacks: refused, or asked live of a tool declared "
        "read-only."))] = ToolPolicy.REFUSE,
    here: Annotated[bool, typer.Option("--here", help=(
        "Run it in this process, with the code installed here, and keep nothing: a trial, "
        "not evidence (by default a worker runs it and keeps its signed record)."))]
    = False,
    bundle: Annotated[Path | None, typer.Option(dir_okay=False, help=(
        "Write the backtest's offline bundle here once it is done."))] = None,
    report: Annotated[Path | None, typer.Option(dir_okay=False, help=(
        "Write the backtest's PDF for the validation file here once it is done."))] = None,
    api_key: ApiKey = None,
    raw: Annotated[bool, typer.Option("--json", help="The whole comparison as JSON.")]
    = False,
) -> None:
    """Run a challenger over recorded cases, as POST /backtests does: a worker runs the
    challenger (an installed agent version) with --model from each case's recorded input;
    a worker tool call the record holds is answered with its recorded result, any other
    is refused; the run is kept as a signed record in the transparency log. Prints the
    decision matrix, agreement with reviewers and the cases whose decision changed. Exit
    2 when there is nothing to run, 1 when the backtest failed."""
    from casetrail.contract.events import ModelRef

    ref = None
    if model is not None:
        provider, _, name = model.partition("/")
        ref = ModelRef.model_validate({"provider": provider, "name": name,
                                       **({"endpoint": endpoint} if endpoint else {})})
    start, end, among = instant_option(since, "--since"), instant_option(until, "--until"), \
        case_ids(cases)
    asked: dict[str, Any] = {
        "agent": agent, "limit": limit, "concurrency": concurrency,
        "toolPolicy": tool_policy.value,
        **({"challenger": challenger} if challenger else {}),
        **({"model": ref.model_dump(mode="json", by_alias=True, exclude_none=True)}
           if ref else {}),
        **({"since": start.isoformat()} if start else {}),
        **({"until": end.isoformat()} if end else {}),
        **({"cases": [str(c) for c in among]} if among is not None else {}),
        **({"maxTokens": max_tokens} if max_tokens else {}),
        **({"maxSeconds": max_seconds} if max_seconds else {})}
    if here and tool_policy is ToolPolicy.LIVE:
        typer.echo("--tool-policy live needs a worker (its capability workers answer): drop "
                   "--here", err=True)
        raise typer.Exit(2)
    found = _here(asked, raw) if here else _on_a_worker(asked, api_key, (bundle, report), raw)
    if raw:
        typer.echo(orjson.dumps(found, option=orjson.OPT_INDENT_2).decode())
    else:
        _print(found)
    if found.get("status") == "failed":
        raise typer.Exit(1)
    raise typer.Exit(0 if found["summary"]["cases"] else 2)


LOG_WAIT_SECONDS = 120.0
"""How long ``--bundle`` and ``--report`` wait for a checkpoint to hold the record."""


async def _logged(services: Any, principal: Any, backtest_id: uuid.UUID, raw: bool
                  ) -> dict[str, Any]:
    """The backtest's bundle once a signed checkpoint holds its record (a bundle is
    handed out only with its log proof), waiting up to ``LOG_WAIT_SECONDS``."""
    import asyncio

    from casetrail.cases import backtests
    from casetrail.cases.errors import NotYet

    deadline = asyncio.get_running_loop().time() + LOG_WAIT_SECONDS
    said = False
    while True:
        try:
            return await backtests.evidence(services, principal, backtest_id)
        except NotYet:
            if asyncio.get_running_loop().time() > deadline:
                raise
            if not raw and not said:
                typer.echo("waiting for a checkpoint of the log to hold the record", err=True)
                said = True
            await asyncio.sleep(0.5)


def _on_a_worker(asked: dict[str, Any], api_key: str | None,
                 files: tuple[Path | None, Path | None], raw: bool) -> dict[str, Any]:
    """Ask for it as REST does, follow it until it ends, read what it found."""
    import asyncio

    from casetrail.cases import backtests
    from casetrail.cli.cases import perform
    from casetrail.contract.auth import Scope

    bundle, report = files

    async def work(services: Any, principal: Any
                   ) -> tuple[dict[str, Any], dict[str, Any] | None, bytes | None]:
        view = await backtests.ask(services, principal, asked)
        if not raw:
            typer.echo(f"backtest {view['backtestId']} asked; a worker runs it", err=True)
        shown = -1
        while view["status"] in ("queued", "running"):
            await asyncio.sleep(0.5)
            view = await backtests.show(services, principal, uuid.UUID(view["backtestId"]))
            done, selected = view["progress"]["done"], view["progress"]["selected"]
            if not raw and selected and done != shown:
                shown = done
                _progress(done, selected)
        evidence, pdf, backtest_id = None, None, uuid.UUID(view["backtestId"])
        if (bundle is not None or report is not None) and view["status"] == "done":
            evidence = await _logged(services, principal, backtest_id, raw)
        if report is not None and view["status"] == "done":
            pdf, _ = await backtests.report(services, principal, backtest_id)
        return view, evidence, pdf

    view, evidence, pdf = perform(api_key, Scope.BACKTESTS, None, work)
    if bundle is not None and evidence is not None:
        bundle.write_bytes(orjson.dumps(evidence, option=orjson.OPT_INDENT_2))
    if report is not None and pdf is not None:
        report.write_bytes(pdf)
    if view["status"] == "failed":
        return {**view, "summary": {"cases": 0}}
    return view


def _here(asked: dict[str, Any], raw: bool) -> dict[str, Any]:
    """Run it in this process and keep nothing (``--here``)."""
    from casetrail.agents import challenger_of
    from casetrail.audit.backtest import Budget, challenger_model
    from casetrail.contract.events import ModelRef
    from casetrail.providers import ModelFactory, model_problem

    try:
        profile = challenger_of(asked, asked["agent"])
    except LookupError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    settings = get_settings()
    ref = ModelRef.model_validate(asked["model"]) if "model" in asked \
        else profile.default_model
    if problem := model_problem(ref, settings):
        typer.echo(f"--model: {problem[1]}", err=True)
        raise typer.Exit(2)
    budget = Budget(asked["concurrency"], asked.get("maxTokens"), asked.get("maxSeconds"))
    since, until = (datetime.fromisoformat(asked[k]) if k in asked else None
                    for k in ("since", "until"))
    among = [uuid.UUID(c) for c in asked["cases"]] if "cases" in asked else None

    async def main() -> dict[str, Any]:
        from casetrail.adapters.store import CaseStore, KeyRegistry, create_pool
        from casetrail.adapters.store.ledger import LedgerStore
        from casetrail.audit.backtest import records_verified, run_backtest, summary
        from casetrail.audit.evidence import Evidence

        factory = ModelFactory(settings)
        pool = await create_pool(settings.database_url, max_size=2)
        try:
            store = CaseStore(pool)
            ids = await store.decided_cases(asked["agent"], since, asked["limit"],
                                            until=until, among=among)
            evidence = Evidence(store, KeyRegistry(pool), LedgerStore(pool))
            done = await run_backtest(ids, store.trails, profile,
                                      challenger_model(factory, profile, ref), ref, budget,
                                      records_verified(evidence), None if raw else _progress)
        finally:
            await pool.close()
            await factory.aclose()
        found = summary(done.outcomes)
        return {"agent": asked["agent"], "status": "done", "recorded": False,
                "challenger": {"agent": profile.name, "version": profile.version,
                               "agentDigest": profile.digest,
                               "model": ref.model_dump(mode="json", by_alias=True,
                                                       exclude_none=True)},
                "selection": {"selected": len(ids), "leftOut": done.left_out_json()},
                "seconds": round(done.seconds, 3),
                **({"stopped": done.stopped} if done.stopped else {}),
                "summary": {k: v for k, v in found.items() if k != "results"},
                "results": found["results"]}

    return run(main())


def _print(found: dict[str, Any]) -> None:
    if found.get("status") == "failed":
        typer.echo(f"backtest {found['backtestId']} failed: {found.get('problem')}")
        return
    summary, model = found["summary"], found["challenger"]["model"]
    typer.echo(f"{summary['cases']} of {found['selection']['selected']} cases of "
               f"{found['agent']} in {found['seconds']} s, challenger "
               f"{found['challenger']['agent']}@{found['challenger']['version']} with "
               f"{model['provider']}/{model['name']}")
    if "record" in found:
        typer.echo(f"recorded: backtest {found['backtestId']}, record "
                   f"{found['record']['hash'][:16]}…, leaf {found['record']['leafIndex']}")
    else:
        typer.echo("not recorded (--here): a trial, not evidence")
    if "stopped" in found:
        typer.echo(f"stopped early: {found['stopped']}")
    for left in found["selection"].get("leftOut") or ():
        typer.echo(f"left out {left['caseId']}: {left['why']}")
    for cell in summary["matrix"]:
        typer.echo(f"  {cell['champion']:>12} -> {cell['challenger']:<12} {cell['cases']}")
    agreed = summary["agreementWithReviewers"]
    typer.echo(f"reviewed {summary['reviewed']}: agreement with reviewers, champion "
               f"{agreed['champion']}, challenger {agreed['challenger']}")
    typer.echo(f"changed {len(summary['changed'])}; calls the record could not answer "
               f"{summary['unansweredCalls']}; tokens {summary['tokens']}")
    for result in found["results"]:
        if result["changed"] or result.get("problem"):
            typer.echo(f"  {result['caseId']}: {result['champion']} -> "
                       f"{result['challenger']}" + (f" ({result['problem']})"
                                                    if result.get("problem") else ""))
