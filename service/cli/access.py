"""``casetrail keys | dead-letters | sql-role | subscribers | signer``: who may do what, and
the messages set aside, for an operator."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from casetrail.cli.common import run
from casetrail.config import Settings, get_settings
from casetrail.contract.auth import SCOPES

if TYPE_CHECKING:
    from casetrail.adapters.store.keys import KeyTable

T = TypeVar("T")

keys_app = typer.Typer(help="API keys: who may call the REST API.", no_args_is_help=True)


async def _with_keys(settings: Settings, work: Any) -> Any:
    from casetrail.adapters.store import ApiKeyStore, create_pool

    pool = await create_pool(settings.database_url, max_size=1)
    try:
        return await work(ApiKeyStore(pool))
    finally:
        await pool.close()


@keys_app.command("create")
def keys_create(
    tenant: Annotated[str, typer.Option(help="The tenant the key acts for.")],
    scopes: Annotated[str, typer.Option(help=f"Comma-separated: {', '.join(SCOPES)}.")],
    name: Annotated[str | None, typer.Option(help="A label for people.")] = None,
    expires_days: Annotated[int | None, typer.Option(min=1, help="Days until it stops "
                                                              "working.")] = None,
    person: Annotated[str | None, typer.Option(
        help="The person who holds the key (an id, never an email): needed for "
             "cases:review; the four-eyes rules compare persons, not keys.")] = None,
) -> None:
    """Create an API key; the key alone goes to stdout, once (only its hash is kept)."""
    from datetime import UTC, datetime, timedelta

    from casetrail.contract.auth import AuthError, check_key_scopes, check_tenant, parse_scopes

    try:
        wanted = parse_scopes(scopes)
        check_key_scopes(wanted, person)
        check_tenant(tenant)
    except AuthError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    expires = datetime.now(UTC) + timedelta(days=expires_days) if expires_days else None
    key_id, key = run(_with_keys(get_settings(),
                                  lambda store: store.create(tenant, wanted, name, expires,
                                                             person)))
    holder = "" if person is None else f", held by {person}"
    typer.echo(f"key {key_id} for tenant {tenant} ({', '.join(wanted)}{holder}) created; it is "
               "shown only now", err=True)
    typer.echo(key)


@keys_app.command("list")
def keys_list() -> None:
    """One key a line, its id first (never the key itself)."""
    for record in run(_with_keys(get_settings(), lambda store: store.all())):
        state = ("revoked" if record.revoked_at else
                 f"expires {record.expires_at:%Y-%m-%d}" if record.expires_at else "active")
        holder = "" if record.person is None else f" (person {record.person})"
        typer.echo(f"{record.key_id}  {record.tenant:<16} {','.join(record.scopes):<40} "
                   f"{state:<18} {record.name or ''}{holder}".rstrip())


@keys_app.command("revoke")
def keys_revoke(key_id: Annotated[str, typer.Argument(help="The key id.")]) -> None:
    """Revoke a key; every API process refuses it within a second. Kept in the
    revocations journal too, so that a restored backup does not bring it back."""
    from datetime import UTC, datetime

    from casetrail.ops.revocations import Revocation, record

    settings = get_settings()
    record(settings, Revocation("api_key", key_id, datetime.now(UTC)))
    if not run(_with_keys(settings, lambda store: store.revoke(key_id))):
        typer.echo(f"no key {key_id}", err=True)
        raise typer.Exit(1)
    typer.echo(f"key {key_id} revoked")


dead_letters_app = typer.Typer(help="Messages set aside with a reason: list, show, redrive.",
                               no_args_is_help=True)


async def _dead_letters(limit: int) -> list[Any]:
    from casetrail.adapters.bus.topology import Topology
    from casetrail.ops.dead_letters import connect_admin, held

    settings = get_settings()
    connection = await connect_admin(settings)
    try:
        async with held(connection, Topology(settings.namespace), limit) as letters:
            return [letter for _, letter in letters]
    finally:
        await connection.close()


@dead_letters_app.command("list")
def dead_letters_list(
    limit: Annotated[int, typer.Option(help="At most this many, oldest first.")] = 1000,
) -> None:
    """Each dead letter: id, type, case, age, where it came from, and the reason. Reading
    them leaves them where they are."""
    from datetime import UTC, datetime

    from casetrail.ops.dead_letters import describe

    letters = run(_dead_letters(limit))
    now = datetime.now(UTC)
    for letter in letters:
        typer.echo(describe(letter, now))
    typer.echo(f"{len(letters)} dead letter{'' if len(letters) == 1 else 's'}", err=True)


@dead_letters_app.command("show")
def dead_letters_show(message_id: Annotated[str, typer.Argument(help="The message id.")]
                      ) -> None:
    """One dead letter's headers and body (exit 1 when there is no such message)."""
    import json

    found = [x for x in run(_dead_letters(100_000)) if x.message_id == message_id]
    if not found:
        typer.echo(f"no dead letter {message_id}", err=True)
        raise typer.Exit(1)
    letter = found[0]
    typer.echo(json.dumps({
        "messageId": letter.message_id, "type": letter.type, "caseId": letter.case_id,
        "reason": letter.reason, "from": {"exchange": letter.exchange,
                                          "routingKey": letter.routing_key},
        "deadLetteredAt": letter.dead_lettered_at.isoformat()
        if letter.dead_lettered_at else None,
        "headers": letter.headers, "body": letter.body.decode(errors="replace"),
    }, indent=2, default=str))


@dead_letters_app.command("redrive")
def dead_letters_redrive(
    message_ids: Annotated[list[str] | None, typer.Argument(help="Message ids.")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Every dead letter (with --reason, "
                                                     "those whose reason contains it).")] = False,
    reason: Annotated[str | None, typer.Option(help="Only those whose reason contains "
                                                    "this text.")] = None,
    again: Annotated[bool, typer.Option(help="Also those redriven once already.")] = False,
) -> None:
    """Republish dead letters to where they came from, as the component that publishes
    there, once; each is removed from the dead letters when the broker confirms it."""
    from casetrail.ops.dead_letters import connect_admin, redrive

    if not message_ids and not all_:
        typer.echo("name message ids, or --all", err=True)
        raise typer.Exit(2)
    settings = get_settings()

    async def main() -> tuple[list[Any], list[Any]]:
        connection = await connect_admin(settings)
        try:
            return await redrive(settings, connection, None if all_ else set(message_ids or ()),
                                 reason, again=again)
        finally:
            await connection.close()

    sent, refused = run(main())
    for letter in sent:
        typer.echo(f"redriven {letter.message_id} to {letter.exchange}:{letter.routing_key}")
    for letter, why in refused:
        typer.echo(f"not redriven {letter.message_id}: {why}", err=True)
    missing = set(message_ids or ()) - {x.message_id for x in sent} \
        - {x.message_id for x, _ in refused}
    for message_id in sorted(missing):
        typer.echo(f"no dead letter {message_id}", err=True)
    if missing or refused:
        raise typer.Exit(1)


sql_role_app = typer.Typer(help="SQL login roles that see one tenant's rows.",
                           no_args_is_help=True)

subscribers_app = typer.Typer(no_args_is_help=True, help=(
    "Per-tenant subscribers on the bus: an identity that reads one queue of that "
    "tenant's events and may do nothing else."))


@subscribers_app.command("create")
def subscribers_create(
    name: Annotated[str, typer.Argument(help="The subscriber's name.")],
    tenant: Annotated[str, typer.Option(help="The tenant whose events it reads.")],
) -> None:
    """Make a subscriber (or renew its password); prints its AMQP URL, once: it reads the
    queue `<namespace>.subscriber.<NAME>`, bounded (the oldest events go first when it
    falls behind)."""
    from casetrail.ops import subscribers

    try:
        url = run(subscribers.create(get_settings(), name, tenant))
    except Exception as exc:  # a refused name, the broker or database away
        typer.echo(f"could not create subscriber {name!r}: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(url)
    typer.echo(f"reads {subscribers.queue_of(get_settings(), name)}: the events of tenant "
               f"{tenant}", err=True)


@subscribers_app.command("list")
def subscribers_list() -> None:
    """The subscribers: name, tenant, queue, created, revoked."""
    from casetrail.ops import subscribers

    for one in run(subscribers.listed(get_settings())):
        typer.echo(f"{one.name}\t{one.tenant}\t{one.queue}\t{one.created_at:%Y-%m-%dT%H:%M:%SZ}"
                   f"\t{'revoked ' + one.revoked_at.isoformat() if one.revoked_at else 'active'}")


@subscribers_app.command("revoke")
def subscribers_revoke(name: Annotated[str, typer.Argument(help="The subscriber.")]) -> None:
    """Delete the subscriber's identity and its queue. Exit 1 when there was none."""
    from casetrail.ops import subscribers

    if not run(subscribers.revoke(get_settings(), name)):
        typer.echo(f"no active subscriber {name!r}", err=True)
        raise typer.Exit(1)
    typer.echo(f"subscriber {name} revoked")


def reader_role(namespace: str, tenant: str) -> str:
    """``<namespace>_reader_<tenant>``: a test stack's roles never meet a live one's."""
    import re

    return f"{re.sub(r'[^a-z0-9_]', '_', namespace)[:20]}_reader_{tenant}"


@sql_role_app.command("create")
def sql_role_create(
    tenant: Annotated[str, typer.Option(help="The tenant whose rows the role sees.")],
    password: Annotated[str | None, typer.Option(
        help="Its password (default: a new random one, printed in the URL).")] = None,
) -> None:
    """Create (or update) the tenant's reader role; prints a connection URL for it. It
    may SELECT event_log, cases and the views, and sees only the tenant's rows."""
    import secrets
    from urllib.parse import quote, urlsplit

    from casetrail.adapters.store import TenantReaders, create_pool
    from casetrail.contract.auth import AuthError, check_tenant

    try:
        check_tenant(tenant)
    except AuthError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    settings = get_settings()
    role, secret = reader_role(settings.namespace, tenant), password or secrets.token_urlsafe(18)

    async def create() -> None:
        pool = await create_pool(settings.database_url, max_size=1)
        try:
            await TenantReaders(pool).create(role, tenant, secret)
        finally:
            await pool.close()

    run(create())
    url = urlsplit(settings.database_url)
    where = f"{url.hostname}:{url.port or 5432}{url.path}"
    typer.echo(f"postgresql://{role}:{quote(secret, safe='')}@{where}")


@sql_role_app.command("drop")
def sql_role_drop(tenant: Annotated[str, typer.Option(help="The tenant.")]) -> None:
    """Remove the tenant's reader role."""
    from casetrail.adapters.store import TenantReaders, create_pool

    settings = get_settings()

    async def drop() -> None:
        pool = await create_pool(settings.database_url, max_size=1)
        try:
            await TenantReaders(pool).drop(reader_role(settings.namespace, tenant))
        finally:
            await pool.close()

    run(drop())


signer_app = typer.Typer(help="The worker's Ed25519 signing key.", no_args_is_help=True)


@signer_app.command("generate")
def signer_generate(
    output: Annotated[Path, typer.Option("-o", "--output", help="Where to write the key "
                                         "(PEM, mode 0600; an existing file is kept).")],
    if_missing: Annotated[bool, typer.Option(
        "--if-missing", help="A key already there is fine: keep it and print its public "
                             "key (for a container's first start).")] = False,
    public_out: Annotated[Path | None, typer.Option(
        "--public-out", help="Also write the public key there (base64), for `casetrail "
                             "signer register` where the private key may not go.")] = None,
) -> None:
    """Make a new signing key; prints its base64 public key."""
    from casetrail.contract.integrity import Signer, public_key_text
    from casetrail.trail.keyfile import read_signer, write_public_key, write_signer

    signer = Signer.generate()
    try:
        write_signer(output, signer)
    except FileExistsError:
        if not if_missing:
            typer.echo(f"{output} exists: a signing key is never overwritten", err=True)
            raise typer.Exit(2) from None
        signer = read_signer(output)
    if public_out is not None:
        write_public_key(public_out, signer)
    typer.echo(f"key {signer.key_id} written to {output}", err=True)
    typer.echo(public_key_text(signer.public_key))


@signer_app.command("public")
def signer_public(key_file: Annotated[Path, typer.Argument(help="The PEM key file.")]) -> None:
    """Print the base64 public key of a signing key (what auditors pass to --trust)."""
    from casetrail.contract.integrity import public_key_text
    from casetrail.errors import PermanentError
    from casetrail.trail.keyfile import read_signer

    try:
        typer.echo(public_key_text(read_signer(key_file).public_key))
    except PermanentError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None


def _key_table(actions: bool, audit: bool) -> KeyTable:
    if actions and audit:
        typer.echo("--actions and --audit name two registries: give one", err=True)
        raise typer.Exit(2)
    return "action_keys" if actions else "audit_keys" if audit else "signing_keys"


@signer_app.command("register")
def signer_register(
    key_file: Annotated[Path, typer.Argument(
        help="The worker's PEM key file, or its public key (base64) in a file.")],
    actions: Annotated[bool, typer.Option(
        "--actions", help="The key is the API's action key (CASETRAIL_ACTION_KEY_FILE), "
        "which signs persons' actions, not a worker's.")] = False,
    audit: Annotated[bool, typer.Option(
        "--audit", help="The key is the auditor's (CASETRAIL_AUDIT_KEY_FILE), which signs "
        "the passes `casetrail audit` keeps.")] = False,
) -> None:
    """Register a worker's key, as the operator (bootstrap URL): events it signs are
    admitted from then on. A worker refuses to start with a key not registered, and no
    component may register one (setup registers CASETRAIL_SIGNING_KEY_FILE, and
    CASETRAIL_ACTION_KEY_FILE as an action key, and the auditor's key)."""
    from casetrail.errors import CasetrailError
    from casetrail.ops.setup import register_signing_key

    try:
        key = run(register_signing_key(get_settings(), key_file, _key_table(actions, audit)))
    except CasetrailError as exc:
        typer.echo(f"casetrail signer register: {exc}", err=True)
        raise typer.Exit(2) from None
    state = "retired" if key.not_valid_after is not None else "registered"
    typer.echo(f"key {key.key_id} {state}")


@signer_app.command("list")
def signer_list(
    actions: Annotated[bool, typer.Option(
        "--actions", help="The registered action keys instead of the workers' keys.")] = False,
    audit: Annotated[bool, typer.Option(
        "--audit", help="The registered auditor's keys instead of the workers' keys.")
    ] = False,
) -> None:
    """The registered keys, one a line: key id, created, retired, not valid after."""
    from casetrail.adapters.store import KeyRegistry, create_pool

    async def describe(settings: Settings) -> list[dict[str, Any]]:
        pool = await create_pool(settings.database_url, max_size=1)
        try:
            return await KeyRegistry(pool, _key_table(actions, audit)).describe()
        finally:
            await pool.close()

    for key in run(describe(get_settings())):
        typer.echo(f"{key['keyId']}\t{key['createdAt']}\t{key['retiredAt'] or '-'}\t"
                   f"{key['notValidAfter'] or '-'}\t{key['publicKey']}")


@signer_app.command("retire")
def signer_retire(
    key_id: Annotated[str, typer.Argument(help="The key id (16 hex characters).")],
    not_valid_after: Annotated[str | None, typer.Option(
        help="ISO 8601 time after which nothing this key signed verifies (default: now; "
             "set it earlier for a compromised key).")] = None,
) -> None:
    """Retire a key: events it signs from then on are refused and do not verify. Kept in
    the revocations journal too, so that a restored backup does not bring it back."""
    from datetime import UTC, datetime

    from casetrail.adapters.store import KeyRegistry, create_pool
    from casetrail.ops.revocations import Revocation, record

    when = datetime.now(UTC)
    if not_valid_after:
        try:
            when = datetime.fromisoformat(not_valid_after.replace("Z", "+00:00"))
        except ValueError:
            typer.echo(f"not an ISO 8601 time: {not_valid_after!r}", err=True)
            raise typer.Exit(2) from None

    async def retire(settings: Settings) -> str:
        pool = await create_pool(settings.database_url, max_size=1)
        try:
            return await KeyRegistry(pool).retire(key_id, when)
        finally:
            await pool.close()

    settings = get_settings()
    record(settings, Revocation("signing_key", key_id, when))
    if run(retire(settings)) == "unknown":
        typer.echo(f"no key {key_id}", err=True)
        raise typer.Exit(1)
    typer.echo(f"key {key_id} retired")
