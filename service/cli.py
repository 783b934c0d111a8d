"""The ``casetrail`` command line."""

from __future__ import annotations

import signal
import sys

# Until a component installs its graceful handler, SIGTERM (a supervisor stopping
# a component that is still starting) means a clean exit. Set before the heavier
# imports below, which take a noticeable part of a second.
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))

import asyncio
import logging
import os
from collections.abc import Coroutine
from pathlib import Path
from typing import Annotated, Any, TypeVar

import orjson
import typer

from service import gc_tuning
from service.cli_cases import case_id_of as _case_id
from service.cli_cases import cases_app, report, reviews_app
from service.config import Settings, get_settings

T = TypeVar("T")

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    # Help as paragraphs: docstrings are wrapped for the source, not for the terminal.
    rich_markup_mode="markdown",
)


def _version(wanted: bool) -> None:
    if wanted:
        from importlib.metadata import version

        typer.echo(f"casetrail {version('casetrail')}")
        raise typer.Exit(0)


@app.callback()
def _main(
    version: Annotated[bool, typer.Option(
        "--version", callback=_version, is_eager=True,
        help="Print casetrail's version and exit.")] = False,
) -> None:
    """casetrail: run tool-using LLM agents and keep every reasoning cycle as evidence.

    Exit codes, for every command: 0 ok; 1 the answer is no (not verified, diverged,
    refused); 2 could not check, or not found."""


def _run(main: Coroutine[Any, Any, T], *, long_running: bool = False) -> T:
    """Run ``main`` on uvloop where it is installed (a faster event loop, same
    semantics), else on asyncio's own. A long-running component first gets the
    garbage collector tuned for it; a short command would only pay for the freeze."""
    if long_running:
        gc_tuning.tune(get_settings().gc_threshold)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.run(main)
    return uvloop.run(main)


def _component(name: str, main: Coroutine[Any, Any, None]) -> None:
    """Run a long-running component; a configuration it cannot run with (no signing
    key, a retired key, ...) is a clear message and exit status 2, not a traceback."""
    from service.agents import registry
    from service.errors import PermanentError

    try:
        registry()  # every plugin loaded, or one clear error before anything starts
        _run(main, long_running=True)
    except PermanentError as exc:
        main.close()
        typer.echo(f"casetrail {name}: {exc}", err=True)
        raise typer.Exit(2) from None


def _logging(level: str | None = None) -> None:
    level = level or get_settings().log_level
    logging.basicConfig(
        level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    logging.getLogger("aio_pika").setLevel(logging.WARNING)
    logging.getLogger("aiormq").setLevel(logging.WARNING)


@app.command()
def setup(
    remove: Annotated[bool, typer.Option(
        "--remove", help="Take the namespace down instead: its database, roles, broker "
        "users, queues, exchanges, policy and secrets file (asks first). A database "
        "holding another namespace's objects is refused.")] = False,
    yes: Annotated[bool, typer.Option(
        "--yes", help="With --remove: do not ask (for scripts).")] = False,
) -> None:
    """Create or update, idempotently, every component's own database role and broker
    user (least privilege), migrate as the owner role, set the broker's policies and
    declare the topology; write the components' URLs to the secrets file. Uses the
    bootstrap (admin) URLs CASETRAIL_DATABASE_URL and CASETRAIL_AMQP_URL."""
    from service import setup as steps
    from service.errors import PermanentError
    from service.migrate import database_name

    _logging()
    settings = get_settings()
    try:
        if remove:
            if not yes and not typer.confirm(
                    f"Remove namespace {settings.namespace!r}: its database "
                    f"{database_name(settings.database_url)!r} with every case and event "
                    "in it, its roles, broker users, queues and exchanges?"):
                typer.echo("nothing removed", err=True)
                raise typer.Exit(1)
            _run(steps.remove(settings))
            typer.echo(f"namespace {settings.namespace} removed")
            return
        report = _run(steps.setup(settings))
    except PermanentError as exc:
        typer.echo(f"casetrail setup: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"migrations applied: {', '.join(report.migrations) or 'none (up to date)'}")
    typer.echo(f"database roles: {', '.join(report.database_roles)}")
    typer.echo(f"broker users: {', '.join(report.broker_users)}")
    typer.echo(f"broker policies set: {settings.namespace}-case-start-limit")
    typer.echo(f"component URLs written to {report.secrets_file}")


@app.command()
def migrate() -> None:
    """Create the database if needed and apply the SQL files in migrations/ (as the
    namespace's owner role once `casetrail setup` made it)."""
    from service.setup import migrate_as_owner

    _logging()
    applied = _run(migrate_as_owner(get_settings()))
    typer.echo(f"migrations applied: {', '.join(applied) if applied else 'none (up to date)'}")


@app.command()
def api(
    host: Annotated[str | None, typer.Option(help="Bind address.")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default CASETRAIL_API_PORT).")] = None,
) -> None:
    """Serve the REST API with uvicorn."""
    import uvicorn

    from service.agents import registry
    from service.api import create_app
    from service.api.streams import STREAMS_CLOSE_SECONDS
    from service.errors import PermanentError
    from service.runtime import prepare
    from service.telemetry import tracing

    _logging()
    settings = get_settings()
    try:
        registry()  # every plugin loaded, or one clear error before anything starts
        prepare(settings, "api")
    except PermanentError as exc:
        typer.echo(f"casetrail api: {exc}", err=True)
        raise typer.Exit(2) from None
    application = create_app(settings)
    gc_tuning.tune(settings.gc_threshold)
    try:
        uvicorn.run(
            application, host=host or settings.api_host, port=port or settings.api_port,
            log_level="warning", access_log=False,
            # Live streams (a case waiting for a person keeps its stream open) would
            # hold a graceful stop forever: they get this long, then are closed.
            timeout_graceful_shutdown=STREAMS_CLOSE_SECONDS,
        )
    finally:
        tracing.shutdown()


@app.command()
def worker() -> None:
    """Run cases: consume start commands and drive the ReAct loop."""
    from service.worker import run_worker

    _logging()
    _component("worker", run_worker(get_settings()))


@app.command()
def consumer() -> None:
    """Persist events from the bus into Postgres."""
    from consumers.event_log import run_consumer

    _logging()
    _component("consumer", run_consumer(get_settings()))


ledger_app = typer.Typer(help="The transparency log: run its sequencer, or manage its key.")
app.add_typer(ledger_app, name="ledger")


@ledger_app.callback(invoke_without_command=True)
def ledger(ctx: typer.Context) -> None:
    """Run the transparency log's sequencer: every stored event a leaf of one Merkle tree,
    signed checkpoints published as ledger.checkpoint (one per deployment; a second one
    stands by)."""
    if ctx.invoked_subcommand is not None:
        return
    from service.ledger.sequencer import run_ledger

    _logging()
    _component("ledger", run_ledger(get_settings()))


@ledger_app.command("key")
def ledger_key(
    output: Annotated[Path, typer.Option("-o", "--output", help="The key file to write "
                                         "(mode 0600; never overwritten).")],
    witness: Annotated[bool, typer.Option(
        "--witness", help="A witness's cosigner key (cosignature/v1) instead of the log's.")]
    = False,
    name: Annotated[str | None, typer.Option(
        help="The key's name: the log's origin (default: CASETRAIL_LOG_ORIGIN, else "
             "casetrail/<namespace>), or the witness's name.")] = None,
    if_missing: Annotated[bool, typer.Option(
        "--if-missing", help="A key already there is fine: keep it.")] = False,
) -> None:
    """Make a signed-note key; prints its verifier key (what verifiers and witnesses
    trust: --trust-log, --log-key, CASETRAIL_LEDGER_WITNESSES)."""
    from service.ledger.note import COSIGNATURE_V1, ED25519, NoteError, NoteSigner
    from service.ledger.sequencer import read_log_key, write_log_key

    kind = COSIGNATURE_V1 if witness else ED25519
    if witness and not name:
        typer.echo("a witness key needs --name (e.g. witness.example.com/w1)", err=True)
        raise typer.Exit(2)
    try:
        signer = NoteSigner.generate(name or get_settings().origin(), kind)
        write_log_key(output, signer)
    except NoteError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    except FileExistsError:
        if not if_missing:
            typer.echo(f"{output} exists: a key is never overwritten", err=True)
            raise typer.Exit(2) from None
        signer = read_log_key(output, kind)
    typer.echo(f"key {signer.name} written to {output}", err=True)
    typer.echo(signer.verifier.text())


@app.command()
def witness(
    log_url: Annotated[str, typer.Option("--log", help="The log's base URL (the API's).")],
    log_key: Annotated[str, typer.Option(
        help="The log's verifier key (<origin>+<hash>+<key>) or a file with it.")],
    state: Annotated[Path, typer.Option(help="Where the witness keeps the last checkpoint "
                                        "it accepted.")] = Path(".casetrail/witness.json"),
    cosign_key: Annotated[Path | None, typer.Option(
        help="This witness's cosigner key (`casetrail ledger key --witness`): cosign each "
             "accepted checkpoint and hand the cosignature to the log.")] = None,
    once: Annotated[bool, typer.Option("--once", help="Check the current checkpoint and "
                                       "exit.")] = False,
    interval: Annotated[float, typer.Option(help="Seconds between checks.")] = 5.0,
) -> None:
    """Follow the log's checkpoints and check each extends the last one accepted: exit 1,
    naming both, when the log forked, shrank or rolled back; 2 when it could not check."""
    from service.errors import PermanentError
    from service.ledger.note import COSIGNATURE_V1, NoteError
    from service.ledger.sequencer import read_log_key
    from service.ledger.witness import (
        LogClient,
        LogMisbehaved,
        LogUnreachable,
        Witness,
        run_witness,
        verifier_key,
    )
    from service.supervisor import run_until_signal

    _logging()
    try:
        the_witness = Witness(verifier_key(log_key), state, LogClient(log_url.rstrip("/")),
                              read_log_key(cosign_key, COSIGNATURE_V1) if cosign_key else None)
    except (NoteError, OSError, PermanentError) as exc:
        typer.echo(f"casetrail witness: {exc}", err=True)
        raise typer.Exit(2) from None
    try:
        _run(run_until_signal(lambda stop: run_witness(the_witness, once, interval, stop)))
    except LogMisbehaved as exc:
        typer.echo(f"casetrail witness: {exc}", err=True)
        raise typer.Exit(1) from None
    except LogUnreachable as exc:
        typer.echo(f"casetrail witness: could not check: {exc}", err=True)
        raise typer.Exit(2) from None


@app.command()
def agents(
    raw: Annotated[bool, typer.Option("--json", help="Print them as JSON.")] = False,
) -> None:
    """The agents and capabilities this installation runs (built in, from installed
    packages' entry points, or named in CASETRAIL_AGENTS) and where each came from.
    Exit 2 when one does not load, naming it."""
    from service.agents import PluginError, registry

    try:
        found = registry()
    except PluginError as exc:
        typer.echo(f"casetrail agents: {exc}", err=True)
        raise typer.Exit(2) from None
    listed: dict[str, list[dict[str, Any]]] = {
        "agents": [{"name": a.name, "version": a.version, "from": found.origins[f"agent:{name}"],
                    "tools": [t.name for t in a.tools],
                    "scripted": a.script is not None} for name, a in found.agents.items()],
        "capabilities": [{"name": name, "from": found.origins[f"capability:{name}"]}
                         for name in found.capabilities]}
    if raw:
        typer.echo(orjson.dumps(listed, option=orjson.OPT_INDENT_2).decode())
        return
    for agent in listed["agents"]:
        typer.echo(f"agent {agent['name']} {agent['version']}  tools: "
                   f"{', '.join(agent['tools']) or '-'}  from {agent['from']}")
    for capability in listed["capabilities"]:
        typer.echo(f"capability {capability['name']}  from {capability['from']}")


@app.command("mcp-tools")
def mcp_tools(
    raw: Annotated[bool, typer.Option("--json", help="Print the catalogs as JSON.")] = False,
) -> None:
    """The tools each configured MCP server (CASETRAIL_MCP_SERVERS) serves, read as a
    capability worker reads them: the name the model sees, and whether a failed call is
    retried. Exit 2 when a server cannot be reached, naming why."""
    from service.engine.tools import mcp_tool_name
    from service.mcptools.session import read_catalogs

    _logging("WARNING")
    read = _run(read_catalogs(get_settings().mcp_servers))
    if raw:
        typer.echo(orjson.dumps({name: c if isinstance(c, str) else c.model_dump(by_alias=True)
                                 for name, c in read.items()}, option=orjson.OPT_INDENT_2).decode())
    for name, catalog in read.items():
        if isinstance(catalog, str):
            typer.echo(f"server {name}: {catalog}", err=True)
        elif not raw:
            for tool in catalog.tools:
                typer.echo(f"{name}  {tool.name}  as {mcp_tool_name(name, tool.name)}  "
                           f"{'retried' if tool.retryable else 'at most once'}  "
                           f"schema {tool.schema_digest[:12]}")
    if not read:
        typer.echo("no MCP servers are configured (CASETRAIL_MCP_SERVERS)", err=True)
    raise typer.Exit(2 if any(isinstance(c, str) for c in read.values()) else 0)


@app.command("capability-worker")
def capability_worker(
    names: Annotated[list[str] | None, typer.Argument(help="Capabilities to serve (all if none).")]
    = None,
    concurrency: Annotated[int | None, typer.Option(help="Requests served at once.")] = None,
) -> None:
    """Serve WorkerTool capabilities (credit-score, risk-model-retrieval, ...): the
    built-in ones and those of plugins (`casetrail agents` lists them)."""
    from service.agents import CAPABILITIES, PluginError
    from service.capability_worker import run_capability_worker

    _logging()
    try:
        wanted = names or sorted(CAPABILITIES)
    except PluginError as exc:
        typer.echo(f"casetrail capability-worker: {exc}", err=True)
        raise typer.Exit(2) from None
    unknown = [n for n in wanted if n not in CAPABILITIES]
    if unknown:
        typer.echo(f"unknown capabilities {unknown}; known: {', '.join(sorted(CAPABILITIES))}",
                   err=True)
        raise typer.Exit(2)
    _component("capability-worker", run_capability_worker(
        get_settings(), [CAPABILITIES[n] for n in wanted], concurrency))


@app.command()
def up(
    port: Annotated[int | None, typer.Option(help="API port (default CASETRAIL_API_PORT).")]
    = None,
) -> None:
    """Run the whole stack in the foreground (migrations, api, worker, consumer,
    capability workers); Ctrl-C stops all of it."""
    from service.demo import run_stack

    _logging()
    settings = get_settings()
    if port:
        settings = settings.model_copy(update={"api_port": port})
    raise typer.Exit(_run(run_stack(settings), long_running=True))


@app.command()
def demo(
    port: Annotated[int | None, typer.Option(help="API port for the demo stack.")] = None,
) -> None:
    """Bring the stack up, run the sample cases, show cycles live and the persisted trail."""
    from service.demo import run_demo

    _logging("WARNING")
    # The demo's own output is the show; its components log warnings only.
    os.environ["CASETRAIL_LOG_LEVEL"] = "WARNING"
    settings = get_settings()
    if port:
        settings = settings.model_copy(update={"api_port": port})
    raise typer.Exit(_run(run_demo(settings), long_running=True))


@app.command()
def tail(
    case: Annotated[str | None, typer.Option(help="Only this case id.")] = None,
    types: Annotated[str | None, typer.Option(help="Comma-separated event types.")] = None,
    raw: Annotated[bool, typer.Option("--json", help="Print the raw JSON envelopes.")] = False,
) -> None:
    """Print events live from the bus."""
    from service.demo import tail_events

    _logging("WARNING")
    wanted = [t.strip() for t in types.split(",")] if types else []
    _run(tail_events(get_settings(), case, wanted, raw))


@app.command()
def trail(
    case_id: Annotated[str, typer.Argument(help="The case id.")],
    raw: Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")] = False,
) -> None:
    """Print a case's persisted trail from Postgres."""
    from service.trail import format_trail

    parsed = _case_id(case_id)

    async def read(evidence: Any) -> tuple[list[dict[str, object]], Any]:
        stored = await evidence.store.find_by_case_and_types(parsed)
        return [e.as_json() for e in stored], await evidence.verify(parsed)

    events, report = _run(_with_evidence(get_settings(), read))
    if not events:  # not found: 2, like verify and export
        typer.echo(f"no events for case {case_id}", err=True)
        raise typer.Exit(2)
    if raw:
        typer.echo(orjson.dumps(events, option=orjson.OPT_INDENT_2).decode())
    else:
        typer.echo(format_trail(case_id, events))
        typer.echo("integrity: " + ("verified" if report.verified else
                                    f"NOT verified ({report.first_problem()})")
                   + (", complete" if report.complete else ", not complete"))


keys_app = typer.Typer(help="API keys: who may call the REST API.", no_args_is_help=True)
app.add_typer(keys_app, name="keys")


async def _with_keys(settings: Settings, work: Any) -> Any:
    from service.store import ApiKeyStore, create_pool

    pool = await create_pool(settings.database_url, max_size=1)
    try:
        return await work(ApiKeyStore(pool))
    finally:
        await pool.close()


@keys_app.command("create")
def keys_create(
    tenant: Annotated[str, typer.Option(help="The tenant the key acts for.")],
    scopes: Annotated[str, typer.Option(help="Comma-separated: cases:start, cases:read, "
                                             "cases:cancel, cases:review, models:override, "
                                             "pii:read, admin.")],
    name: Annotated[str | None, typer.Option(help="A label for people.")] = None,
    expires_days: Annotated[int | None, typer.Option(min=1, help="Days until it stops "
                                                              "working.")] = None,
    person: Annotated[str | None, typer.Option(
        help="The person who holds the key (an id, never an email): needed for "
             "cases:review; the four-eyes rules compare persons, not keys.")] = None,
) -> None:
    """Create an API key; the key alone goes to stdout, once (only its hash is kept)."""
    from datetime import UTC, datetime, timedelta

    from service.auth import AuthError, check_key_scopes, check_tenant, parse_scopes

    try:
        wanted = parse_scopes(scopes)
        check_key_scopes(wanted, person)
        check_tenant(tenant)
    except AuthError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    expires = datetime.now(UTC) + timedelta(days=expires_days) if expires_days else None
    key_id, key = _run(_with_keys(get_settings(),
                                  lambda store: store.create(tenant, wanted, name, expires,
                                                             person)))
    holder = "" if person is None else f", held by {person}"
    typer.echo(f"key {key_id} for tenant {tenant} ({', '.join(wanted)}{holder}) created; it is "
               "shown only now", err=True)
    typer.echo(key)


@keys_app.command("list")
def keys_list() -> None:
    """One key a line, its id first (never the key itself)."""
    for record in _run(_with_keys(get_settings(), lambda store: store.all())):
        state = ("revoked" if record.revoked_at else
                 f"expires {record.expires_at:%Y-%m-%d}" if record.expires_at else "active")
        holder = "" if record.person is None else f" (person {record.person})"
        typer.echo(f"{record.key_id}  {record.tenant:<16} {','.join(record.scopes):<40} "
                   f"{state:<18} {record.name or ''}{holder}".rstrip())


@keys_app.command("revoke")
def keys_revoke(key_id: Annotated[str, typer.Argument(help="The key id.")]) -> None:
    """Revoke a key; every API process refuses it within a second."""
    if not _run(_with_keys(get_settings(), lambda store: store.revoke(key_id))):
        typer.echo(f"no key {key_id}", err=True)
        raise typer.Exit(1)
    typer.echo(f"key {key_id} revoked")


dead_letters_app = typer.Typer(help="Messages set aside with a reason: list, show, redrive.",
                               no_args_is_help=True)
app.add_typer(dead_letters_app, name="dead-letters")


async def _dead_letters(limit: int) -> list[Any]:
    from service.bus.topology import Topology
    from service.dead_letters import connect_admin, held

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

    from service.dead_letters import describe

    letters = _run(_dead_letters(limit))
    now = datetime.now(UTC)
    for letter in letters:
        typer.echo(describe(letter, now))
    typer.echo(f"{len(letters)} dead letter{'' if len(letters) == 1 else 's'}", err=True)


@dead_letters_app.command("show")
def dead_letters_show(message_id: Annotated[str, typer.Argument(help="The message id.")]
                      ) -> None:
    """One dead letter's headers and body (exit 1 when there is no such message)."""
    import json

    found = [x for x in _run(_dead_letters(100_000)) if x.message_id == message_id]
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
    from service.dead_letters import connect_admin, redrive

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

    sent, refused = _run(main())
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
app.add_typer(sql_role_app, name="sql-role")

subscribers_app = typer.Typer(no_args_is_help=True, help=(
    "Per-tenant subscribers on the bus: an identity that reads one queue of that "
    "tenant's events and may do nothing else."))
app.add_typer(subscribers_app, name="subscribers")


@subscribers_app.command("create")
def subscribers_create(
    name: Annotated[str, typer.Argument(help="The subscriber's name.")],
    tenant: Annotated[str, typer.Option(help="The tenant whose events it reads.")],
) -> None:
    """Make a subscriber (or renew its password); prints its AMQP URL, once: it reads the
    queue `<namespace>.subscriber.<NAME>`, bounded (the oldest events go first when it
    falls behind)."""
    from service import subscribers

    try:
        url = _run(subscribers.create(get_settings(), name, tenant))
    except Exception as exc:  # a refused name, the broker or database away
        typer.echo(f"could not create subscriber {name!r}: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(url)
    typer.echo(f"reads {subscribers.queue_of(get_settings(), name)}: the events of tenant "
               f"{tenant}", err=True)


@subscribers_app.command("list")
def subscribers_list() -> None:
    """The subscribers: name, tenant, queue, created, revoked."""
    from service import subscribers

    for one in _run(subscribers.listed(get_settings())):
        typer.echo(f"{one.name}\t{one.tenant}\t{one.queue}\t{one.created_at:%Y-%m-%dT%H:%M:%SZ}"
                   f"\t{'revoked ' + one.revoked_at.isoformat() if one.revoked_at else 'active'}")


@subscribers_app.command("revoke")
def subscribers_revoke(name: Annotated[str, typer.Argument(help="The subscriber.")]) -> None:
    """Delete the subscriber's identity and its queue. Exit 1 when there was none."""
    from service import subscribers

    if not _run(subscribers.revoke(get_settings(), name)):
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

    from service.auth import AuthError, check_tenant
    from service.store import TenantReaders, create_pool

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

    _run(create())
    url = urlsplit(settings.database_url)
    where = f"{url.hostname}:{url.port or 5432}{url.path}"
    typer.echo(f"postgresql://{role}:{quote(secret, safe='')}@{where}")


@sql_role_app.command("drop")
def sql_role_drop(tenant: Annotated[str, typer.Option(help="The tenant.")]) -> None:
    """Remove the tenant's reader role."""
    from service.store import TenantReaders, create_pool

    settings = get_settings()

    async def drop() -> None:
        pool = await create_pool(settings.database_url, max_size=1)
        try:
            await TenantReaders(pool).drop(reader_role(settings.namespace, tenant))
        finally:
            await pool.close()

    _run(drop())


signer_app = typer.Typer(help="The worker's Ed25519 signing key.", no_args_is_help=True)
app.add_typer(signer_app, name="signer")


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
    from service.integrity import Signer, public_key_text
    from service.keyfile import read_signer, write_public_key, write_signer

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
    from service.errors import PermanentError
    from service.integrity import public_key_text
    from service.keyfile import read_signer

    try:
        typer.echo(public_key_text(read_signer(key_file).public_key))
    except PermanentError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None


@signer_app.command("register")
def signer_register(
    key_file: Annotated[Path, typer.Argument(
        help="The worker's PEM key file, or its public key (base64) in a file.")],
) -> None:
    """Register a worker's key, as the operator (bootstrap URL): events it signs are
    admitted from then on. A worker refuses to start with a key not registered, and no
    component may register one (setup registers CASETRAIL_SIGNING_KEY_FILE)."""
    from service.errors import CasetrailError
    from service.setup import register_signing_key

    try:
        key = _run(register_signing_key(get_settings(), key_file))
    except CasetrailError as exc:
        typer.echo(f"casetrail signer register: {exc}", err=True)
        raise typer.Exit(2) from None
    state = "retired" if key.not_valid_after is not None else "registered"
    typer.echo(f"key {key.key_id} {state}")


@signer_app.command("list")
def signer_list() -> None:
    """The registered keys, one a line: key id, created, retired, not valid after."""
    from service.store import KeyRegistry, create_pool

    async def describe(settings: Settings) -> list[dict[str, Any]]:
        pool = await create_pool(settings.database_url, max_size=1)
        try:
            return await KeyRegistry(pool).describe()
        finally:
            await pool.close()

    for key in _run(describe(get_settings())):
        typer.echo(f"{key['keyId']}\t{key['createdAt']}\t{key['retiredAt'] or '-'}\t"
                   f"{key['notValidAfter'] or '-'}\t{key['publicKey']}")


@signer_app.command("retire")
def signer_retire(
    key_id: Annotated[str, typer.Argument(help="The key id (16 hex characters).")],
    not_valid_after: Annotated[str | None, typer.Option(
        help="ISO 8601 time after which nothing this key signed verifies (default: now; "
             "set it earlier for a compromised key).")] = None,
) -> None:
    """Retire a key: events it signs from then on are refused and do not verify."""
    from datetime import datetime

    from service.store import KeyRegistry, create_pool

    when = None
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

    if _run(retire(get_settings())) == "unknown":
        typer.echo(f"no key {key_id}", err=True)
        raise typer.Exit(1)
    typer.echo(f"key {key_id} retired")


async def _with_evidence(settings: Settings, work: Any) -> Any:
    from service.evidence import Evidence
    from service.ledger.store import LedgerStore
    from service.store import CaseStore, KeyRegistry, create_pool

    pool = await create_pool(settings.database_url, max_size=2)
    try:
        return await work(Evidence(CaseStore(pool), KeyRegistry(pool), LedgerStore(pool)))
    finally:
        await pool.close()


@app.command()
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


@app.command()
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

    from service.agents import AGENTS
    from service.replay import Replay, recorded, replay_many
    from service.store import CaseStore, create_pool

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

    replays = _run(main())
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
            typer.echo(f"  first divergence at cycle {one.divergence.cycle}:")
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
    return _case_or_exit(case_id, failure, _with_evidence(get_settings(), work))


def _case_or_exit(case_id: str, failure: str, main: Coroutine[Any, Any, Any]) -> Any:
    """What ``main`` returns for the case; exit 2 when it could not be done (``failure``
    says what) or the case is unknown (``main`` returned ``None``)."""
    from service.errors import CasetrailError

    try:
        found = _run(main)
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
        return
    typer.echo(f"NOT verified: {report.first_problem()}"
               + (f" (+{len(report.problems) - 1} more)" if len(report.problems) > 1 else ""),
               err=True)
    raise typer.Exit(1)


def _log_summary(log: dict[str, Any]) -> str:
    head = log["checkpoint"]
    if head is None:
        return "transparency log: the bundle carries no checkpoint"
    signed = "signed by the trusted log key" if log["checkpointTrusted"] else \
        "its signature not checked (no --trust-log)"
    cosigned = f", cosigned by {', '.join(log['witnesses'])}" if log["witnesses"] else ""
    return (f"transparency log: {log['eventsInLog']} events included in checkpoint "
            f"{head['origin']} size {head['treeSize']}, {signed}{cosigned}")


@app.command()
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
    from service.cases import export as export_case
    from service.cli_cases import operate

    bundle = operate(lambda services, who: export_case(services, who, parsed))
    output.write_bytes(orjson.dumps(bundle, option=orjson.OPT_INDENT_2))
    typer.echo(f"{len(bundle['events'])} events written to {output}", err=True)
    if _unlogged(bundle):
        typer.echo(f"{_unlogged(bundle)} events are not in a signed checkpoint yet (is the "
                   "ledger running?): they carry no log proof", err=True)


def _unlogged(bundle: dict[str, Any]) -> int:
    return sum(1 for e in bundle["events"] if e.get("integrity") and "logProof" not in e)


@app.command()
def erase(
    case_id: Annotated[str, typer.Argument(help="The case id.")],
) -> None:
    """Erase an ended case's sensitive values (crypto-shredding: its key is destroyed),
    recorded as `operator` in the access log and as CASE_ERASED in its trail. Acts as
    the API does, with the API's identity. Exit 0 erased (or already), 1 refused (still
    running, or nothing sensitive), 2 could not (unknown case, database or broker down)."""
    from service.cases import erase as erase_case
    from service.cli_cases import operate

    parsed = _case_id(case_id)
    done = operate(lambda services, who: erase_case(services, who, parsed))
    typer.echo(f"{'erased' if done.outcome == 'erased' else 'already erased'} at "
               f"{done.erased_at}")


@app.command("verify-bundle")
def verify_bundle_command(
    bundle_file: Annotated[Path, typer.Argument(help="A bundle from `casetrail export`.")],
    trust: Annotated[list[str], typer.Option(
        "--trust", help="A signing key you trust: KEY[@NOT_VALID_AFTER] (base64, and the "
        "time after which you no longer trust it, ISO 8601), or a trust file of such "
        "lines; repeatable. Trust comes from you only, never from the bundle.")],
    trust_log: Annotated[list[str] | None, typer.Option(
        "--trust-log", help="The transparency log's verifier key (<origin>+<hash>+<key>) "
        "or a file with one; then every event must be in a checkpoint it signed.")] = None,
    trust_witness: Annotated[list[str] | None, typer.Option(
        "--trust-witness", help="A witness's verifier key (cosignature/v1) or a file with "
        "one; its cosignature is then required. Repeatable.")] = None,
    log: Annotated[str | None, typer.Option(
        "--log", help="The log's base URL (the API's): also check that the log today still "
        "extends the bundle's checkpoint (nothing removed or rewritten since).")] = None,
    raw: Annotated[bool, typer.Option("--json", help="Print the whole report as JSON.")]
    = False,
) -> None:
    """Check a bundle offline, with nothing but the file and the keys you trust: exit 0
    verified, 1 not, 2 could not check."""
    from service.evidence import BundleError, trusted_keys, verify_bundle
    from service.ledger.note import NoteError
    from service.ledger.witness import LogUnreachable, check_log_today, verifier_key

    try:
        keys = [key for t in trust for key in trusted_keys(t)]
        log_keys = [verifier_key(t) for t in trust_log or []]
        witnesses = [verifier_key(t) for t in trust_witness or []]
        bundle = orjson.loads(bundle_file.read_bytes())
        report = verify_bundle(bundle, keys, log_keys, witnesses)
        if log is not None:
            if not log_keys:
                raise BundleError("--log needs --trust-log: the log's answers are checked "
                                  "against its key")
            report.problems.extend(_run(check_log_today(log, bundle, log_keys)))
    except (OSError, orjson.JSONDecodeError, BundleError, NoteError, LogUnreachable) as exc:
        typer.echo(f"could not check {bundle_file}: {exc}", err=True)
        raise typer.Exit(2) from None
    _report(report, raw)


app.add_typer(cases_app, name="cases")
app.add_typer(reviews_app, name="reviews")
app.command("report")(report)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
