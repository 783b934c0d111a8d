"""``casetrail verify | audit | replay | export | erase | verify-bundle``: an auditor's commands
(registered on the top-level ``casetrail`` app)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from pathlib import Path
from typing import Annotated, Any, TypeVar

import orjson
import typer

from casetrail.adapters.store.pool import DatabaseError
from casetrail.cli.cases import case_id_of as _case_id
from casetrail.cli.common import (
    LogToday,
    TrustAction,
    TrustLog,
    TrustWitness,
    run,
    with_evidence,
)
from casetrail.config import get_settings

T = TypeVar("T")

audit_app = typer.Typer()


@audit_app.command()
def verify(
    case_id: Annotated[str, typer.Argument(help="The case id.")],
    raw: Annotated[bool, typer.Option("--json", help="Print the whole report as JSON.")]
    = False,
) -> None:
    """Check a case's stored trail: exit 0 verified, 1 not (with the first problem),
    2 could not check (unknown case, database down)."""
    parsed = _case_id(case_id)
    _report(_about_case(case_id, "could not check",
                        lambda ev: ev.verify(parsed)), raw)


@audit_app.command()
def replay(
    case_id: Annotated[str | None, typer.Argument(help="The case to replay.")] = None,
    every: Annotated[bool, typer.Option("--all", help="Replay every decided case (of "
                                        "--agent, since --since).")] = False,
    agent: Annotated[str | None, typer.Option(help="With --all: only this agent's cases.")]
    = None,
    since: Annotated[str | None, typer.Option(help="With --all: cases created at or after "
                                              "this RFC 3339 time.")] = None,
    limit: Annotated[int, typer.Option(help="With --all: at most this many cases.")]
    = 100_000,
    agent_version: Annotated[str | None, typer.Option(
        "--agent-version", help="Refuse unless the installed agent is this version (the "
        "replay runs the code installed here).")] = None,
    raw: Annotated[bool, typer.Option("--json", help="One JSON object per case.")] = False,
) -> None:
    """Would the agent's current code decide the same? Runs recorded cases again from
    their trail: recorded model turns (a scripted model runs again) and recorded worker
    tool results, local tools run again; no model is asked, no worker tool runs, nothing
    is written. Exit 0 when every case replays the same, 1 when one diverged, 2 when
    nothing could be replayed."""
    from datetime import datetime

    from casetrail.adapters.store import CaseStore, create_pool
    from casetrail.agents import AGENTS
    from casetrail.audit.replay import Replay, recorded, replay_many

    if (case_id is None) == (not every):
        typer.echo("name one case, or --all", err=True)
        raise typer.Exit(2)
    if agent_version is not None:
        wrong = sorted(a.name for a in AGENTS.values()
                       if (agent is None or a.name == agent) and a.version != agent_version)
        if wrong:
            typer.echo(f"the installed {', '.join(wrong)} is not version {agent_version}",
                       err=True)
            raise typer.Exit(2)
    start = None
    if since is not None:
        try:
            start = datetime.fromisoformat(since.replace("Z", "+00:00"))
        except ValueError:
            typer.echo(f"--since is not an RFC 3339 time: {since!r}", err=True)
            raise typer.Exit(2) from None

    async def main() -> list[Replay]:
        pool = await create_pool(get_settings().database_url, max_size=2)
        try:
            store = CaseStore(pool)
            ids = [_case_id(case_id)] if case_id is not None else \
                await store.decided_cases(agent, start, limit)
            replays: list[Replay] = []
            for chunk in range(0, len(ids), 1000):
                trails = await store.trails(ids[chunk:chunk + 1000])
                replays += await replay_many({c: recorded(t) for c, t in trails.items()})
            return replays
        finally:
            await pool.close()

    replays = run(main())
    if raw:
        for one in replays:
            typer.echo(orjson.dumps(one.as_json()).decode())
    else:
        _print_replays(replays, summary=every)
    if not replays or all(r.outcome == "unreplayable" for r in replays):
        raise typer.Exit(2)
    raise typer.Exit(1 if any(r.outcome == "diverged" for r in replays) else 0)


def _print_replays(replays: list[Any], *, summary: bool) -> None:
    for one in replays:
        if one.outcome == "same" and summary:
            continue
        line = f"{one.case_id} {one.agent}: {one.outcome}"
        if one.outcome == "unreplayable":
            line += f" ({one.reason})"
        else:
            line += f", decision {one.recorded_decision} -> {one.replayed_decision or 'unknown'}"
            if one.refused_by:
                line += f" (refused by the checks {', '.join(one.refused_by)})"
        typer.echo(line)
        if one.divergence is not None:
            typer.echo(f"  first divergence at cycle {one.divergence.cycle + 1} "
                       f"(cycleIndex {one.divergence.cycle}):")
            typer.echo(f"    recorded: {one.divergence.recorded}")
            typer.echo(f"    replayed: {one.divergence.replayed}")
    if summary:
        counts = {o: sum(r.outcome == o for r in replays)
                  for o in ("same", "diverged", "unreplayable")}
        changed = sum(r.recorded_decision != r.replayed_decision for r in replays
                      if r.outcome == "diverged")
        typer.echo(f"{len(replays)} cases replayed: {counts['same']} same, "
                   f"{counts['diverged']} diverged ({changed} with another or an unknown "
                   f"decision), {counts['unreplayable']} not replayable")


def _about_case(case_id: str, failure: str, work: Any) -> Any:
    """What ``work`` finds out from the case's evidence; exit 2 when the database cannot
    be reached (``failure`` says what could not be done) or the case is unknown."""
    return _case_or_exit(case_id, failure, with_evidence(get_settings(), work))


def _case_or_exit(case_id: str, failure: str, main: Coroutine[Any, Any, Any]) -> Any:
    """What ``main`` returns for the case; exit 2 when it could not be done (``failure``
    says what) or the case is unknown (``main`` returned ``None``)."""
    from casetrail.errors import CasetrailError

    try:
        found = run(main)
    except CasetrailError as exc:
        typer.echo(f"{failure}: {exc}", err=True)
        raise typer.Exit(2) from None
    if found is None:
        typer.echo(f"no case {case_id}", err=True)
        raise typer.Exit(2)
    return found


def _report(report: Any, raw: bool) -> None:
    if raw:
        typer.echo(orjson.dumps(report.as_json(), option=orjson.OPT_INDENT_2).decode())
    if report.verified:
        if not raw:
            state = "complete" if report.complete else "awaiting review" if report.parked \
                else "still running"
            typer.echo(f"verified: {report.events} events, {len(report.attempts)} attempt(s), "
                       f"{state}")
            for review in report.reviews:
                reviewer = review.get("reviewer") or {}
                decided = review.get("decision", {}).get("decision") if isinstance(
                    review.get("decision"), dict) else None
                via = f"key {reviewer.get('keyId')}" if reviewer.get("via") == "key" else "oidc"
                typer.echo(f"reviewed: {review['verdict']}"
                           f"{'' if decided is None else ' → ' + str(decided)} by "
                           f"{reviewer.get('subject')} (via {via}) at {review['reviewedAt']}")
            if report.log is not None:
                typer.echo(_log_summary(report.log))
            for warning in report.warnings:
                typer.echo(f"warning: attempt {warning.attempt} seq {warning.seq}: "
                           f"{warning.code}: {warning.message}")
        return
    typer.echo(f"NOT verified: {report.first_problem()}"
               + (f" (+{len(report.problems) - 1} more)" if len(report.problems) > 1 else ""),
               err=True)
    raise typer.Exit(1)


def _backtest_checked(report: Any, bundle: dict[str, Any]) -> None:
    """What a backtest bundle's check found, and which checks it ran."""
    results = len(bundle.get("results") or [])
    typer.echo(f"verified: backtest {report.case_id}: its signed record and its {results} "
               "per-case results")
    typer.echo("checked: the record's hash and its signature under a key you trust; each "
               "result against the digest the record names (same cases, same order, none "
               "added)")
    log = report.log
    if log is None or log["checkpoint"] is None:
        typer.echo("not checked: the record's place in the log (the bundle carries no proof)")
    elif not log["checkpointTrusted"]:
        typer.echo("not checked: the log's signature on the checkpoint (no --trust-log); "
                   "the record's inclusion proof was checked against it")
    else:
        head = log["checkpoint"]
        cosigned = f", cosigned by {', '.join(log['witnesses'])}" if log["witnesses"] else ""
        typer.echo(f"checked: the record is in the log, included in checkpoint "
                   f"{head['origin']} size {head['treeSize']}, signed by the trusted log "
                   f"key{cosigned}")


def _log_summary(log: dict[str, Any]) -> str:
    head = log["checkpoint"]
    if head is None:
        return "transparency log: the bundle carries no checkpoint"
    signed = "signed by the trusted log key" if log["checkpointTrusted"] else \
        "its signature not checked (no --trust-log)"
    cosigned = f", cosigned by {', '.join(log['witnesses'])}" if log["witnesses"] else ""
    return (f"transparency log: {log['eventsInLog']} events included in checkpoint "
            f"{head['origin']} size {head['treeSize']}, {signed}{cosigned}")


@audit_app.command()
def export(
    case_id: Annotated[str, typer.Argument(help="The case id.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="The bundle file to write.")],
    wait_for_log: Annotated[float, typer.Option(
        help="Seconds to wait for the log to sign a checkpoint holding every event.")]
    = 30.0,
) -> None:
    """Write a case's offline bundle: the events exactly as signed, the public keys, and
    each event's inclusion proof in the transparency log with the signed checkpoint."""
    parsed = _case_id(case_id)

    async def logged_bundle(evidence: Any) -> Any:
        deadline = asyncio.get_running_loop().time() + wait_for_log
        while True:
            bundle = await evidence.bundle(parsed)
            if bundle is None or not _unlogged(bundle) or \
                    asyncio.get_running_loop().time() >= deadline:
                return bundle
            await asyncio.sleep(0.5)

    _about_case(case_id, "could not export", logged_bundle)
    # The bundle as the export operation gives it, which logs the export.
    from casetrail.cases import export as export_case
    from casetrail.cli.cases import operate

    bundle = operate(lambda services, who: export_case(services, who, parsed))
    output.write_bytes(orjson.dumps(bundle, option=orjson.OPT_INDENT_2))
    typer.echo(f"{len(bundle['events'])} events written to {output}", err=True)
    if _unlogged(bundle):
        typer.echo(f"{_unlogged(bundle)} events are not in a signed checkpoint yet (is the "
                   "ledger running?): they carry no log proof", err=True)


def _unlogged(bundle: dict[str, Any]) -> int:
    return sum(1 for e in bundle["events"] if e.get("integrity") and "logProof" not in e)


@audit_app.command()
def erase(
    case_id: Annotated[str, typer.Argument(help="The case id.")],
) -> None:
    """Erase an ended case's sensitive values (crypto-shredding: its key is destroyed),
    through its record: signed for `operator` with the API's action key, recorded as
    CASE_ERASED in its trail, shredded when that event is stored, and in the access log.
    Acts as the API does, with the API's identity and action key. Exit 0 erased (or
    already, or under way), 1 refused (still running, nothing sensitive, held), 2 could
    not (unknown case, database or broker down, no action key)."""
    from casetrail.cases import erase as erase_case
    from casetrail.cli.cases import operate

    parsed = _case_id(case_id)
    done = operate(lambda services, who: erase_case(services, who, parsed))
    if done.outcome == "erasing":
        typer.echo("erasing: the values go when its CASE_ERASED is stored")
        return
    typer.echo(f"{'erased' if done.outcome == 'erased' else 'already erased'} at "
               f"{done.erased_at}")


@audit_app.command("audit")
def audit_log(
    full: Annotated[bool, typer.Option("--full", help="From the first leaf, not from where "
                                       "the last pass stopped.")] = False,
    raw: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    every: Annotated[float | None, typer.Option(
        help="Keep auditing, a pass every so many seconds, with metrics (alert "
             "CasetrailAuditFindings); stops on SIGTERM.")] = None,
) -> None:
    """Audit the whole log: every leaf has its stored event and every stored event its
    leaf, every case logged since the last pass verifies, the tree keeps every witnessed
    checkpoint's root, no append-only trigger is off. Exit 0 clean, 1 findings (listed
    per case), 2 could not check."""
    from casetrail.audit.whole_log import audit_namespace

    settings = get_settings()
    if every is None:
        try:
            report = run(audit_namespace(settings, full=full))
        except (OSError, DatabaseError) as exc:
            typer.echo(f"casetrail audit: could not check: {exc}", err=True)
            raise typer.Exit(2) from None
        _print_audit(report.as_json(), raw)
        raise typer.Exit(0 if report.clean else 1)
    run(_audit_every(settings, full, every, raw), long_running=True)


async def _audit_every(settings: Any, full: bool, interval: float, raw: bool) -> None:
    """Passes until SIGTERM, as the ``auditor`` component (its metrics port)."""
    from casetrail.audit.whole_log import audit_namespace
    from casetrail.components.runtime import component
    from casetrail.components.supervisor import run_until_signal
    from casetrail.telemetry import metrics

    async def passes(stop: asyncio.Event) -> None:
        first = full
        while not stop.is_set():
            try:
                report = await audit_namespace(settings, full=first)
                _print_audit(report.as_json(), raw)
                first = False
            except (OSError, DatabaseError) as exc:
                metrics.AUDIT_PASSES.labels("failed").inc()
                typer.echo(f"casetrail audit: could not check: {exc}", err=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)

    async with component(settings, "auditor"):
        await run_until_signal(passes)


def _print_audit(report: dict[str, Any], raw: bool) -> None:
    if raw:
        typer.echo(orjson.dumps(report).decode())
        return
    verdict = "clean" if report["clean"] else f"{len(report['findings'])} findings"
    typer.echo(f"audited a log of {report['toLeaf']} leaves"
               f"{' (full pass)' if report['full'] else ''}: {report['casesChecked']} "
               f"cases logged from leaf {report['fromLeaf']} verified, in "
               f"{report['seconds']:.1f} s: {verdict}")
    for finding in report["findings"]:
        where = f"case {finding['caseId']}" if "caseId" in finding else "log"
        typer.echo(f"  {finding['kind']}: {where}: {finding['detail']}")


@audit_app.command("verify-bundle")
def verify_bundle_command(
    bundle_file: Annotated[Path, typer.Argument(help=(
        "A bundle from `casetrail export`, or a backtest's (`casetrail backtest --bundle`, "
        "GET /backtests/{id}/bundle)."))],
    trust: Annotated[list[str], typer.Option(
        "--trust", help="A signing key you trust: KEY[@NOT_VALID_AFTER] (base64, and the "
        "time after which you no longer trust it, ISO 8601), or a trust file of such "
        "lines; repeatable. Trust comes from you only, never from the bundle.")],
    trust_log: TrustLog = None, trust_witness: TrustWitness = None,
    trust_action: TrustAction = None, log: LogToday = None,
    raw: Annotated[bool, typer.Option("--json", help="Print the whole report as JSON.")]
    = False,
) -> None:
    """Check a bundle offline, with nothing but the file and the keys you trust: exit 0
    verified, 1 not, 2 could not check."""
    from casetrail.audit.backtest_record import BACKTEST_FORMAT, verify_backtest_bundle
    from casetrail.audit.evidence import BundleError, trusted_keys, verify_bundle
    from casetrail.ledger.note import NoteError
    from casetrail.ledger.witness import LogUnreachable, check_log_today, verifier_key

    try:
        keys = [key for t in trust for key in trusted_keys(t)]
        log_keys = [verifier_key(t) for t in trust_log or []]
        witnesses = [verifier_key(t) for t in trust_witness or []]
        bundle = orjson.loads(bundle_file.read_bytes())
        actions = None if trust_action is None else [
            key.public_key for t in trust_action for key in trusted_keys(t)]
        backtest = isinstance(bundle, dict) and bundle.get("format") == BACKTEST_FORMAT
        if backtest:
            report = verify_backtest_bundle(bundle, keys, log_keys, witnesses)
        else:
            report = verify_bundle(bundle, keys, log_keys, witnesses, actions)
        if log is not None:
            if not log_keys:
                raise BundleError("--log needs --trust-log: the log's answers are checked "
                                  "against its key")
            report.problems.extend(run(check_log_today(log, bundle, log_keys)))
    except (OSError, orjson.JSONDecodeError, BundleError, NoteError, LogUnreachable) as exc:
        typer.echo(f"could not check {bundle_file}: {exc}", err=True)
        raise typer.Exit(2) from None
    if backtest and report.verified and not raw:
        _backtest_checked(report, bundle)
    else:
        _report(report, raw)
    if log is not None and not raw:  # only reached when nothing was found wrong
        typer.echo(f"checked: the log at {log} today still extends the bundle's checkpoint "
                   "(a consistency proof, checked here)")
