"""``casetrail retention …`` and ``casetrail holds …``: retention policies, business
dates, the plan, and legal holds at the command line, the same operations REST calls
(service/cases/retention.py), with the same scopes and two-persons rules: as the holder
of an API key (``--api-key`` or ``CASETRAIL_API_KEY``), or as the operator for
``--tenant`` (who is not a person: approving a policy or releasing a hold takes a
person's key). Exit codes: 0 done; 1 refused; 2 could not."""

from __future__ import annotations

import uuid
from datetime import date, datetime
from typing import Annotated, Literal

import typer

from casetrail.cli.cases import ApiKey, perform, print_json
from casetrail.contract.auth import Scope

Tenant = Annotated[str, typer.Option(help="The operator's tenant (with an API key: its own).")]

retention_app = typer.Typer(no_args_is_help=True, rich_markup_mode="markdown", help=(
    "How long decided cases and their personal data are kept (default: everything, for "
    "good), and what the next retention passes would do."))
holds_app = typer.Typer(no_args_is_help=True, rich_markup_mode="markdown", help=(
    "Legal holds: a held case is neither expired nor erased (the database refuses). "
    "Releasing one takes two persons."))


def _tenant(api_key: str | None, tenant: str) -> str | None:
    return None if api_key else tenant


@retention_app.command("policies")
def policies(api_key: ApiKey = None, tenant: Tenant = "default") -> None:
    """The floor, the presets and every version of the tenant's policies."""
    from casetrail.cases import retention

    print_json(perform(api_key, Scope.READ, _tenant(api_key, tenant), retention.policies))


@retention_app.command("set")
def set_policy(
    agent: Annotated[str, typer.Argument(help="An agent, or '*' for the tenant's default.")],
    reason: Annotated[str, typer.Option(help="Why; kept with the version.")],
    preset: Annotated[str | None, typer.Option(help="ai-act-minimum, sec-17a-4 or amlr.")]
    = None,
    keep_days: Annotated[int | None, typer.Option(help="Days a decided case is kept.")] = None,
    keep_forever: Annotated[bool, typer.Option("--keep-forever", help=(
        "Keep cases for good (what the default does).")) ] = False,
    personal_data_days: Annotated[int | None, typer.Option(
        help="Days its personal data is kept (at most --keep-days).")] = None,
    business_key: Annotated[str | None, typer.Option(help=(
        "Count from the date set for this business key (`retention business-date`), not "
        "from the case's end."))] = None,
    archive: Annotated[bool, typer.Option("--archive", help=(
        "Archive each case's bundle before it expires (`casetrail archive verify` checks "
        "the archive offline)."))] = False,
    api_key: ApiKey = None, tenant: Tenant = "default",
) -> None:
    """A new version of a policy: in force at once when it keeps at least as much, else
    once another person approves it (`retention approve`)."""
    from casetrail.cases import retention

    asked: dict[str, object] = {"reason": reason, "business_key": business_key,
                                "archive": archive}
    if preset:
        asked["preset"] = preset
    if keep_days is not None or keep_forever:
        asked["keep_days"] = None if keep_forever else keep_days
    if personal_data_days is not None:
        asked["personal_data_days"] = personal_data_days
    print_json(perform(api_key, Scope.RETENTION, _tenant(api_key, tenant),
                       lambda services, who: retention.set_policy(services, who, agent,
                                                                  asked)))


@retention_app.command("approve")
def approve(policy_id: Annotated[int, typer.Argument(help="The version's policyId.")],
            api_key: ApiKey = None) -> None:
    """Approve another person's policy that shortens what is kept."""
    from casetrail.cases import retention

    print_json(perform(api_key, Scope.RETENTION, None,
                       lambda services, who: retention.approve_policy(services, who,
                                                                      policy_id)))


@retention_app.command("business-date")
def business_date(
    field: Annotated[str, typer.Argument(help="A business key field, e.g. customerId.")],
    value: Annotated[str, typer.Argument(help="Its value.")],
    ended_on: Annotated[datetime, typer.Argument(formats=["%Y-%m-%d"], help=(
        "When the relationship ended (YYYY-MM-DD).")) ],
    api_key: ApiKey = None, tenant: Tenant = "default",
) -> None:
    """Set the date a policy counted from `business_date` counts this key's cases from."""
    from casetrail.cases import retention

    day: date = ended_on.date()
    print_json(perform(api_key, Scope.RETENTION, _tenant(api_key, tenant),
                       lambda services, who: retention.set_business_date(
                           services, who, field, value, day)))


@retention_app.command("plan")
def plan(limit: Annotated[int, typer.Option(min=1, max=1000)] = 100,
         api_key: ApiKey = None, tenant: Tenant = "default") -> None:
    """A dry run: the cases past their time (or their personal data's), oldest first,
    and which a hold keeps. Nothing is changed."""
    from casetrail.cases import retention

    print_json(perform(api_key, Scope.READ, _tenant(api_key, tenant),
                       lambda services, who: retention.plan(services, who, limit)))


@holds_app.command("place")
def place(
    reason: Annotated[str, typer.Option(help="Why (a matter, a complaint).")],
    case: Annotated[str | None, typer.Option(help="Hold this case.")] = None,
    key: Annotated[str | None, typer.Option(help=(
        "Hold every case with this business key, present and future: FIELD=VALUE."))] = None,
    whole_tenant: Annotated[bool, typer.Option("--whole-tenant", help=(
        "Hold every case of the tenant."))] = False,
    ends_at: Annotated[datetime | None, typer.Option(help="When it ends by itself.")] = None,
    api_key: ApiKey = None, tenant: Tenant = "default",
) -> None:
    """Place a legal hold on a case, a business key or the whole tenant."""
    from casetrail.cases import retention

    chosen = [c for c in (case, key, whole_tenant or None) if c]
    if len(chosen) != 1:
        typer.echo("name exactly one of --case, --key, --whole-tenant", err=True)
        raise typer.Exit(2)
    scope: Literal["case", "business_key", "tenant"] = (
        "case" if case else "business_key" if key else "tenant")
    pair = None
    if key is not None:
        field, sep, value = key.partition("=")
        if not sep:
            typer.echo("--key is FIELD=VALUE", err=True)
            raise typer.Exit(2)
        pair = (field, value)
    case_id = uuid.UUID(case) if case else None
    print_json(perform(api_key, Scope.HOLDS, _tenant(api_key, tenant),
                       lambda services, who: retention.place_hold(
                           services, who, scope, case_id, pair, reason, ends_at)))


@holds_app.command("list")
def list_holds(every: Annotated[bool, typer.Option("--all", help=(
                   "Ended holds too."))] = False,
               case: Annotated[str | None, typer.Option(help="Only holds keeping this case.")]
               = None,
               api_key: ApiKey = None, tenant: Tenant = "default") -> None:
    """The tenant's holds, newest first, with their releases."""
    from casetrail.cases import retention

    case_id = uuid.UUID(case) if case else None
    print_json({"holds": perform(api_key, Scope.READ, _tenant(api_key, tenant),
                                 lambda services, who: retention.holds(
                                     services, who, active_only=not every,
                                     case_id=case_id))})


@holds_app.command("release")
def release(hold_id: Annotated[str, typer.Argument(help="The holdId.")],
            reason: Annotated[str, typer.Option(help="Why it may end.")],
            api_key: ApiKey = None) -> None:
    """Your release of a hold; it ends with a second person's."""
    from casetrail.cases import retention

    parsed = uuid.UUID(hold_id)
    print_json(perform(api_key, Scope.HOLDS, None,
                       lambda services, who: retention.release_hold(services, who, parsed,
                                                                    reason)))
