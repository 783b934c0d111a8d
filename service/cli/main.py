"""The ``casetrail`` command line."""

from __future__ import annotations

import signal
import sys

# Until a component installs its graceful handler, SIGTERM (a supervisor stopping
# a component that is still starting) means a clean exit. Set before the heavier
# imports below, which take a noticeable part of a second.
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))

import os
from collections.abc import Coroutine
from pathlib import Path
from typing import Annotated, Any, TypeVar

import orjson
import typer

from casetrail.cli.access import (
    dead_letters_app,
    keys_app,
    signer_app,
    sql_role_app,
    subscribers_app,
)
from casetrail.cli.archive import archive_app
from casetrail.cli.audit import audit_app
from casetrail.cli.backtest import backtest
from casetrail.cli.cases import case_id_of as _case_id
from casetrail.cli.cases import cases_app, report, reviews_app
from casetrail.cli.common import configure_logging as _logging
from casetrail.cli.common import run as _run
from casetrail.cli.common import with_evidence
from casetrail.cli.configuration import a2a_agents, agents, check, mcp_tools
from casetrail.cli.dataset import dataset_app
from casetrail.cli.persons import persons_app
from casetrail.cli.retention import holds_app, retention_app
from casetrail.components import gc_tuning
from casetrail.config import get_settings

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


def _component(name: str, main: Coroutine[Any, Any, None]) -> None:
    """Run a long-running component; a configuration it cannot run with (no signing
    key, a retired key, ...) is a clear message and exit status 2, not a traceback."""
    from casetrail.agents import registry
    from casetrail.errors import PermanentError

    try:
        registry()  # every plugin loaded, or one clear error before anything starts
        _run(main, long_running=True)
    except PermanentError as exc:
        main.close()
        typer.echo(f"casetrail {name}: {exc}", err=True)
        raise typer.Exit(2) from None


@app.command()
def setup(
    remove: Annotated[bool, typer.Option(
        "--remove", help="Take the namespace down instead: its database, roles, broker "
        "users, queues, exchanges, policy, secrets file and the ledger's state file (asks "
        "first). A database "
        "holding another namespace's objects is refused.")] = False,
    yes: Annotated[bool, typer.Option(
        "--yes", help="With --remove: do not ask (for scripts).")] = False,
) -> None:
    """Create or update, idempotently, every component's own database role and broker
    user (least privilege), migrate as the owner role, set the broker's policies and
    declare the topology; write the components' URLs to the secrets file. Uses the
    bootstrap (admin) URLs CASETRAIL_DATABASE_URL and CASETRAIL_AMQP_URL."""
    from casetrail.adapters.store.migrate import database_name
    from casetrail.errors import PermanentError
    from casetrail.ops import setup as steps

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
            removed = _run(steps.remove(settings))
            typer.echo(f"namespace {settings.namespace} removed")
            for path in removed:
                typer.echo(f"removed {path}")
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
    for again in report.reapplied:
        typer.echo(f"revoked or retired again (the database predates it): {again}")


@app.command()
def migrate() -> None:
    """Create the database if needed and apply the SQL files in migrations/ (as the
    namespace's owner role once `casetrail setup` made it)."""
    from casetrail.adapters.store.namespace import migrate_as_owner

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

    from casetrail.agents import registry
    from casetrail.api import create_app
    from casetrail.api.streams import STREAMS_CLOSE_SECONDS
    from casetrail.components.runtime import prepare
    from casetrail.errors import PermanentError
    from casetrail.telemetry import tracing
    from casetrail.trail.keyfile import action_signer

    _logging()
    settings = get_settings()
    try:
        registry()  # every plugin loaded, or one clear error before anything starts
        action_signer(settings)  # it signs every person's action: none, no API
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
            timeout_keep_alive=settings.api_keep_alive_seconds,
            # Live streams (a case waiting for a person keeps its stream open) would
            # hold a graceful stop forever: they get this long, then are closed.
            timeout_graceful_shutdown=STREAMS_CLOSE_SECONDS,
        )
    finally:
        tracing.shutdown()


@app.command()
def worker() -> None:
    """Run cases: consume start commands and drive the ReAct loop."""
    from casetrail.components.worker import run_worker

    _logging()
    _component("worker", run_worker(get_settings()))


@app.command()
def consumer() -> None:
    """Persist events from the bus into Postgres."""
    from casetrail.consumers.event_log import run_consumer

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
    from casetrail.components.sequencer import run_ledger
    from casetrail.ledger.high_water import LogHalted

    _logging()
    try:
        _component("ledger", run_ledger(get_settings()))
    except LogHalted as exc:  # it said why while it ran; once more on the way out
        typer.echo(f"casetrail ledger: halted ({exc.reason.value}): {exc}", err=True)
        raise typer.Exit(3) from None


@ledger_app.command("accept-size")
def ledger_accept_size(
    size: Annotated[int, typer.Argument(min=0, help="The tree size to accept as the log's "
                                        "high-water mark (at most the stored tree's).")],
    reason: Annotated[str, typer.Option(help="Why: kept on the record with the size.")],
    by: Annotated[str | None, typer.Option(help="Who accepts it (default: the OS user).")]
    = None,
) -> None:
    """When the ledger lost both of its anchors (state file and log-head stream), accept a
    size on the record so that it signs again; refused while either can be read."""
    from casetrail.components.ledger_accept import accept_size
    from casetrail.errors import PermanentError

    _logging()
    try:
        accepted = _run(accept_size(get_settings(), size, reason, by))
    except PermanentError as exc:
        typer.echo(f"casetrail ledger accept-size: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"accepted a tree of {accepted.size} leaves, root {accepted.root.hex()}; "
               f"kept in ledger_acceptances and {accepted.state_file}")


@ledger_app.command("recover")
def ledger_recover(
    bundles: Annotated[Path, typer.Option(
        help="A directory of bundles exported before the restore (`casetrail export`, "
             "GET /cases/{id}/bundle): they give back the lost leaves.")],
) -> None:
    """When the ledger halted because its database was restored from an older backup:
    append the lost leaves again from bundles, only if they are complete and rebuild the
    very checkpoint the log signed; else nothing is written and the missing leaves are
    named."""
    from casetrail.components.ledger_recover import recover
    from casetrail.errors import PermanentError

    _logging()
    try:
        done = _run(recover(get_settings(), bundles))
    except PermanentError as exc:
        typer.echo(f"casetrail ledger recover: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"appended {done.appended} leaves of {done.cases} cases: the tree holds "
               f"{done.size} leaves again, the root the log signed; their events stay "
               "lost from the database (`casetrail audit` names their cases)")


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
    from casetrail.ledger.log_key import read_log_key, write_log_key
    from casetrail.ledger.note import COSIGNATURE_V1, ED25519, NoteError, NoteSigner

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
    import asyncio

    from casetrail.components.runtime import component
    from casetrail.components.supervisor import run_until_signal
    from casetrail.errors import PermanentError
    from casetrail.ledger.log_key import read_log_key
    from casetrail.ledger.note import COSIGNATURE_V1, NoteError
    from casetrail.ledger.witness import (
        LogClient,
        LogMisbehaved,
        LogUnreachable,
        Witness,
        run_witness,
        verifier_key,
    )

    _logging()
    try:
        the_witness = Witness(verifier_key(log_key), state, LogClient(log_url.rstrip("/")),
                              read_log_key(cosign_key, COSIGNATURE_V1) if cosign_key else None)
    except (NoteError, OSError, PermanentError) as exc:
        typer.echo(f"casetrail witness: {exc}", err=True)
        raise typer.Exit(2) from None
    async def follow() -> None:
        if once:  # one look: no metrics port, nothing to watch
            await run_witness(the_witness, once, interval, asyncio.Event())
            return
        async with component(get_settings(), "witness"):
            await run_until_signal(lambda stop: run_witness(the_witness, once, interval, stop))

    try:
        _run(follow())
    except LogMisbehaved as exc:
        typer.echo(f"casetrail witness: {exc}", err=True)
        raise typer.Exit(1) from None
    except LogUnreachable as exc:
        typer.echo(f"casetrail witness: could not check: {exc}", err=True)
        raise typer.Exit(2) from None


@app.command("capability-worker")
def capability_worker(
    names: Annotated[list[str] | None, typer.Argument(help="Capabilities to serve (all if none).")]
    = None,
    concurrency: Annotated[int | None, typer.Option(help="Requests served at once.")] = None,
) -> None:
    """Serve WorkerTool capabilities (credit-score, risk-model-retrieval, ...): the
    built-in ones and those of plugins (`casetrail agents` lists them)."""
    from casetrail.agents import CAPABILITIES, PluginError
    from casetrail.components.capability_worker import run_capability_worker

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


def _refusing(name: str, main: Coroutine[Any, Any, int]) -> int:
    """A stack's exit status; one it may not start (keys its data needs are missing, say)
    is a clear message and status 2."""
    from casetrail.errors import PermanentError

    try:
        return _run(main, long_running=True)
    except PermanentError as exc:
        typer.echo(f"casetrail {name}: {exc}", err=True)
        return 2


@app.command()
def up(
    port: Annotated[int | None, typer.Option(help="API port (default CASETRAIL_API_PORT).")]
    = None,
) -> None:
    """Run the whole stack in the foreground (migrations, api, worker, consumer,
    capability workers); Ctrl-C stops all of it."""
    from casetrail.cli.demo import run_stack

    _logging()
    settings = get_settings()
    if port:
        settings = settings.model_copy(update={"api_port": port})
    raise typer.Exit(_refusing("up", run_stack(settings)))


@app.command()
def demo(
    port: Annotated[int | None, typer.Option(help="API port for the demo stack.")] = None,
) -> None:
    """Bring the stack up, run the sample cases, show cycles live and the persisted trail."""
    from casetrail.cli.demo import run_demo

    _logging("WARNING")
    # The demo's own output is the show; its components log warnings only.
    os.environ["CASETRAIL_LOG_LEVEL"] = "WARNING"
    settings = get_settings()
    if port:
        settings = settings.model_copy(update={"api_port": port})
    raise typer.Exit(_refusing("demo", run_demo(settings)))


@app.command()
def tail(
    case: Annotated[str | None, typer.Option(help="Only this case id.")] = None,
    types: Annotated[str | None, typer.Option(help="Comma-separated event types.")] = None,
    raw: Annotated[bool, typer.Option("--json", help="Print the raw JSON envelopes.")] = False,
) -> None:
    """Print events live from the bus."""
    from casetrail.cli.demo import tail_events

    _logging("WARNING")
    wanted = [t.strip() for t in types.split(",")] if types else []
    _run(tail_events(get_settings(), case, wanted, raw))


@app.command()
def trail(
    case_id: Annotated[str, typer.Argument(help="The case id.")],
    raw: Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")] = False,
) -> None:
    """Print a case's persisted trail from Postgres."""
    from casetrail.audit.rendering import format_trail

    parsed = _case_id(case_id)

    async def read(evidence: Any) -> tuple[list[dict[str, object]], Any]:
        stored = await evidence.store.find_by_case_and_types(parsed)
        return [e.as_json() for e in stored], await evidence.verify(parsed)

    events, report = _run(with_evidence(get_settings(), read))
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


app.command()(agents)
app.command("mcp-tools")(mcp_tools)
app.command("a2a-agents")(a2a_agents)
app.command()(backtest)
app.command()(check)
app.add_typer(keys_app, name="keys")
app.add_typer(dead_letters_app, name="dead-letters")
app.add_typer(sql_role_app, name="sql-role")
app.add_typer(subscribers_app, name="subscribers")
app.add_typer(signer_app, name="signer")
app.add_typer(persons_app, name="persons")
app.add_typer(retention_app, name="retention")
app.add_typer(holds_app, name="holds")
app.add_typer(archive_app, name="archive")
app.add_typer(dataset_app, name="dataset")

app.registered_commands.extend(audit_app.registered_commands)

app.add_typer(cases_app, name="cases")
app.add_typer(reviews_app, name="reviews")
app.command("report")(report)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
