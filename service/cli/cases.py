"""``casetrail cases start|list|show|cancel``: the case operations at the command line,
the same ones the API calls (service/cases/), with the same scopes: as the holder of
an API key (``--api-key`` or ``CASETRAIL_API_KEY``), or as the operator (every scope,
every tenant; a case it starts belongs to ``--tenant``), with the API's identity.

Exit codes as for every command: 0 done; 1 refused (invalid, a conflict, a quota, a
missing scope); 2 could not (no such case, database or broker unavailable)."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, TypeVar

import orjson
import typer

from casetrail.config import get_settings
from casetrail.contract.auth import EVERY_TENANT, Principal, Scope, key_id_of, operator
from casetrail.contract.events import CaseStatus

T = TypeVar("T")

cases_app = typer.Typer(no_args_is_help=True, rich_markup_mode="markdown",
                        help="Start, list, show and cancel cases (as REST does).")

ApiKey = Annotated[str | None, typer.Option(
    "--api-key", envvar="CASETRAIL_API_KEY", show_envvar=True,
    help="Act as this API key (its tenant and scopes); without one, as the operator.")]


def perform(api_key: str | None, scope: Scope, tenant: str | None,
             work: Callable[[Any, Principal], Awaitable[T]]) -> T:
    """Open the case services, find who acts, check the scope, run ``work``; a refusal or
    a failure is a message and its exit code."""
    from casetrail.cases import case_services
    from casetrail.cases.errors import CaseProblem, NotFound
    from casetrail.cli.common import run as _run
    from casetrail.errors import CasetrailError

    async def main() -> T:
        async with case_services(get_settings(), pool_size=2, patience=5,
                                 name="casetrail-cli") as services:
            principal = await _principal(services, api_key, tenant)
            if not principal.allows(scope):
                raise _Refused(f"this API key lacks the scope {scope.value!r}")
            return await work(services, principal)

    try:
        return _run(main())
    except (_Refused, CaseProblem) as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2 if isinstance(exc, NotFound) else 1) from None
    except CasetrailError as exc:
        typer.echo(f"could not: {exc}", err=True)
        raise typer.Exit(2) from None


class _Refused(Exception):
    pass


def operate(work: Callable[[Any, Principal], Awaitable[T]]) -> T:
    """``work`` as the operator (every tenant, every scope): for the operator's own
    commands (`erase`, `export`)."""
    return perform(None, Scope.ADMIN, None, work)


async def _principal(services: Any, api_key: str | None, tenant: str | None) -> Principal:
    if api_key is None:
        return operator(tenant or EVERY_TENANT)
    from casetrail.adapters.store import ApiKeyStore

    key_id = key_id_of(api_key)
    record = None if key_id is None else await ApiKeyStore(services.pool).find(key_id)
    principal = None if record is None else record.principal(api_key, datetime.now(UTC))
    if principal is None:
        raise _Refused("the API key is unknown, revoked or expired")
    if tenant is not None and tenant != principal.tenant:
        raise _Refused(f"the API key acts for tenant {principal.tenant!r}, not {tenant!r}")
    return principal


def case_id_of(text: str) -> uuid.UUID:
    """The case id a command was given; exit 2 when it is not one."""
    try:
        return uuid.UUID(text)
    except ValueError:
        typer.echo(f"not a case id: {text!r}", err=True)
        raise typer.Exit(2) from None


def print_json(value: Any) -> None:
    typer.echo(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode())


@cases_app.command("start")
def cases_start(
    agent: Annotated[str, typer.Argument(help="The agent (`GET /agents`).")],
    input_file: Annotated[Path, typer.Option(
        "--input", "-i", help="The case's input as JSON (a file, or - for standard input).")],
    tenant: Annotated[str, typer.Option(help="The operator's tenant for this case.")]
    = "default",
    idempotency_key: Annotated[str | None, typer.Option(
        help="As the Idempotency-Key header: a repeat returns the first case.")] = None,
    api_key: ApiKey = None,
) -> None:
    """Start a case: validated and recorded as `queued`, its start command confirmed by
    the broker; prints the case as `POST /cases` answers it."""
    from pydantic import ValidationError

    from casetrail.cases import start
    from casetrail.cases.requests import CaseRequest

    raw = sys.stdin.buffer.read() if str(input_file) == "-" else input_file.read_bytes()
    try:
        request = CaseRequest(agent=agent, input=orjson.loads(raw))
    except (orjson.JSONDecodeError, ValidationError) as exc:
        typer.echo(f"the input is not a JSON object: {exc}", err=True)
        raise typer.Exit(1) from None
    started = perform(api_key, Scope.START, None if api_key else tenant,
                       lambda services, who: start(services, who, request, idempotency_key))
    row = started.case
    print_json({"caseId": str(row["case_id"]), "status": row["status"], "agent": row["agent"],
            "tenant": row["tenant_id"], "replayed": not started.created})


@cases_app.command("list")
def cases_list(
    agent: Annotated[str | None, typer.Option(help="Only this agent's cases.")] = None,
    status: Annotated[CaseStatus | None, typer.Option(help="Only cases in this status.")]
    = None,
    decision: Annotated[str | None, typer.Option(help="Only answers with this decision.")]
    = None,
    since: Annotated[str | None, typer.Option(help="Created at or after (RFC 3339).")] = None,
    until: Annotated[str | None, typer.Option(help="Created before (RFC 3339).")] = None,
    limit: Annotated[int, typer.Option(min=1, max=200, help="At most this many.")] = 50,
    cursor: Annotated[str | None, typer.Option(help="The next page's cursor.")] = None,
    checks: Annotated[str | None, typer.Option(
        help="`failed`: only cases where one of the agent's checks failed.")] = None,
    tenant: Annotated[str, typer.Option(help="The operator's tenant to list.")] = "default",
    raw: Annotated[bool, typer.Option("--json", help="The page as JSON.")] = False,
    api_key: ApiKey = None,
) -> None:
    """The tenant's cases, newest first (as `GET /cases`)."""
    from casetrail.cases import search

    page = perform(api_key, Scope.READ, None if api_key else tenant,
                    lambda services, who: search(services, who, agent=agent, status=status,
                                                 decision=decision, since=since, until=until,
                                                 limit=limit, cursor=cursor,
                                                 checks=checks))
    if raw:
        print_json(page)
        return
    for item in page["items"]:
        typer.echo(f"{item['caseId']}  {item['createdAt']}  {item['agent']:<16} "
                   f"{item['status']:<10} {item['decision'] or '-'}")
    if page["nextCursor"]:
        typer.echo(f"more: --cursor {page['nextCursor']}", err=True)


@cases_app.command("show")
def cases_show(
    case_id: Annotated[str, typer.Argument(help="The case id.")],
    api_key: ApiKey = None,
) -> None:
    """A case as `GET /cases/{id}` shows it: status, totals, answer, integrity."""
    from casetrail.cases import get

    parsed = case_id_of(case_id)
    print_json(perform(api_key, Scope.READ, None,
                    lambda services, who: get(services, who, parsed)))


def report(
    case_id: Annotated[str, typer.Argument(help="The case id.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="The PDF file to write.")],
    api_key: ApiKey = None,
) -> None:
    """Write a case's report as one PDF: its decision, checks, reviews, integrity and
    transparency-log status, how to verify it, and every cycle; the evidence bundle is
    attached (its SHA-256 printed). Logged as an export, like `GET /cases/{id}/report`."""
    from casetrail.cases.reporting import report as make_report

    parsed = case_id_of(case_id)
    made = perform(api_key, Scope.READ, None,
                    lambda services, who: make_report(services, who, parsed))
    output.write_bytes(made.pdf)
    typer.echo(f"{output}: {len(made.pdf):,} bytes; the attached bundle's SHA-256 is "
               f"{made.bundle_sha256}", err=True)


@cases_app.command("cancel")
def cases_cancel(
    case_id: Annotated[str, typer.Argument(help="The case id.")],
    reason: Annotated[str | None, typer.Option(help="Why (recorded in its trail).")] = None,
    api_key: ApiKey = None,
) -> None:
    """Ask a case to stop; its `CASE_CANCELLED` follows in the trail. Exit 1 when it has
    already ended."""
    from casetrail.cases import cancel

    parsed = case_id_of(case_id)
    perform(api_key, Scope.CANCEL, None,
             lambda services, who: cancel(services, who, parsed, reason))
    typer.echo(f"case {parsed} is stopping")


reviews_app = typer.Typer(no_args_is_help=True, rich_markup_mode="markdown",
                          help="Cases awaiting a person: list, show, decide (as REST does).")


@reviews_app.command("list")
def reviews_list(
    agent: Annotated[str | None, typer.Option(help="Only this agent's cases.")] = None,
    decision: Annotated[str | None, typer.Option(help="Only this waiting decision.")] = None,
    checks: Annotated[str | None, typer.Option(
        help="`failed`: only cases where one of the agent's checks failed.")] = None,
    overdue: Annotated[bool, typer.Option(
        "--overdue", help="Only reviews past their due time.")] = False,
    tenant: Annotated[str | None, typer.Option(
        help="The operator's tenant to list (default: every tenant).")] = None,
    raw: Annotated[bool, typer.Option("--json", help="The queue as JSON.")] = False,
    api_key: ApiKey = None,
) -> None:
    """Cases awaiting review, oldest wait first (as `GET /reviews`)."""
    from casetrail.cases.reviewing import open_reviews

    found = perform(api_key, Scope.READ, None if api_key else tenant,
                     lambda services, who: open_reviews(
                         services, who, agent=agent, decision=decision,
                         checks_failed=True if checks == "failed" else None,
                         overdue=True if overdue else None))
    if raw:
        print_json({"reviews": found})
        return
    for item in found:
        late = "  OVERDUE" if item["overdue"] else ""
        typer.echo(f"{item['caseId']}  waiting since {item['waitingSince']}  "
                   f"{item['agent']:<16} {item['decision'] or '-':<10} "
                   f"{','.join(item['reviewReasons'])}{late}")


@reviews_app.command("show")
def reviews_show(
    case_id: Annotated[str, typer.Argument(help="The case id.")],
    api_key: ApiKey = None,
) -> None:
    """One case awaiting review: the agent's answer, its checks, why a person decides."""
    from casetrail.cases.reviewing import one_review

    parsed = case_id_of(case_id)
    print_json(perform(api_key, Scope.READ, None,
                    lambda services, who: one_review(services, who, parsed)))


@reviews_app.command("decide")
def reviews_decide(
    case_id: Annotated[str, typer.Argument(help="The case id.")],
    verdict: Annotated[str, typer.Option(help="confirm, override or return.")],
    reason: Annotated[str, typer.Option(help="Why (recorded in the trail).")],
    decision_file: Annotated[Path | None, typer.Option(
        "--decision", help="For override: the decision as JSON (a file, or -).")] = None,
    api_key: Annotated[str | None, typer.Option(
        "--api-key", envvar="CASETRAIL_API_KEY", show_envvar=True,
        help="Your API key, made for you (`keys create --person`): a review is a "
             "person's, never the operator's.")] = None,
) -> None:
    """Review a case awaiting it, as the person whose key this is (four eyes: never
    the one who started it)."""
    from casetrail.cases.reviewing import Verdict, review

    if not api_key:
        typer.echo("a review is a person's: give your API key (--api-key or "
                   "CASETRAIL_API_KEY), made with `keys create --person`", err=True)
        raise typer.Exit(1)
    if verdict not in ("confirm", "override", "return"):
        typer.echo(f"verdict {verdict!r}: confirm, override or return", err=True)
        raise typer.Exit(1)
    decision = None
    if decision_file is not None:
        raw = sys.stdin.buffer.read() if str(decision_file) == "-" else \
            decision_file.read_bytes()
        try:
            decision = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            typer.echo(f"the decision is not JSON: {exc}", err=True)
            raise typer.Exit(1) from None
    parsed = case_id_of(case_id)
    given: Verdict = verdict  # type: ignore[assignment]  # checked above
    done = perform(api_key, Scope.REVIEW, None,
                    lambda services, who: review(services, who, parsed, given, reason,
                                                 decision))
    typer.echo(f"case {parsed}: {done.verdict} by {done.reviewer['subject']}; it goes on "
               "from your review")


@reviews_app.command("answer")
def reviews_answer(
    case_id: Annotated[str, typer.Argument(help="The case id.")],
    call_id: Annotated[str, typer.Option(help="The question's call id (`reviews show`).")],
    answer: Annotated[str, typer.Option(help="Your answer (the model reads it).")],
    api_key: Annotated[str | None, typer.Option(
        "--api-key", envvar="CASETRAIL_API_KEY", show_envvar=True,
        help="Your API key, made for you (`keys create --person`).")] = None,
) -> None:
    """Answer the question the model asked a person, as the person whose key this is."""
    from casetrail.cases.reviewing import answer as answer_question

    if not api_key:
        typer.echo("an answer is a person's: give your API key (--api-key or "
                   "CASETRAIL_API_KEY), made with `keys create --person`", err=True)
        raise typer.Exit(1)
    parsed = case_id_of(case_id)
    done = perform(api_key, Scope.REVIEW, None,
                    lambda services, who: answer_question(services, who, parsed, call_id,
                                                          answer))
    typer.echo(f"case {parsed}: answered by {done.reviewer['subject']}; it goes on")
