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
import uuid
from collections.abc import Coroutine
from typing import Annotated, Any, TypeVar

import orjson
import typer

from service import gc_tuning
from service.config import Settings, get_settings

T = TypeVar("T")

app = typer.Typer(
    help="casetrail: run tool-using LLM agents and keep every reasoning cycle as evidence.",
    no_args_is_help=True,
    add_completion=False,
)


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
    from service.errors import PermanentError

    try:
        _run(main, long_running=True)
    except PermanentError as exc:
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
def migrate() -> None:
    """Create the database if needed and apply the SQL files in migrations/."""
    from service.migrate import migrate as run_migrations

    _logging()
    applied = _run(run_migrations(get_settings().database_url))
    typer.echo(f"migrations applied: {', '.join(applied) if applied else 'none (up to date)'}")


@app.command()
def api(
    host: Annotated[str | None, typer.Option(help="Bind address.")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default CASETRAIL_API_PORT).")] = None,
) -> None:
    """Serve the REST API with uvicorn."""
    import uvicorn

    from service.api import create_app

    _logging()
    settings = get_settings()
    application = create_app(settings)
    gc_tuning.tune(settings.gc_threshold)
    uvicorn.run(
        application, host=host or settings.api_host, port=port or settings.api_port,
        log_level="warning", access_log=False,
    )


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


@app.command("capability-worker")
def capability_worker(
    names: Annotated[list[str] | None, typer.Argument(help="Capabilities to serve (all if none).")]
    = None,
    concurrency: Annotated[int | None, typer.Option(help="Requests served at once.")] = None,
) -> None:
    """Serve WorkerTool capabilities (credit-score, risk-model-retrieval, ...)."""
    from service.agents import CAPABILITIES
    from service.capability_worker import run_capability_worker

    _logging()
    wanted = names or sorted(CAPABILITIES)
    unknown = [n for n in wanted if n not in CAPABILITIES]
    if unknown:
        typer.echo(f"unknown capabilities {unknown}; known: {', '.join(sorted(CAPABILITIES))}",
                   err=True)
        raise typer.Exit(2)
    _run(run_capability_worker(get_settings(), [CAPABILITIES[n] for n in wanted], concurrency),
         long_running=True)


@app.command()
def up() -> None:
    """Run the whole stack in the foreground (migrations, api, worker, consumer,
    capability workers); Ctrl-C stops all of it."""
    from service.demo import run_stack

    _logging()
    raise typer.Exit(_run(run_stack(get_settings()), long_running=True))


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
    from service.store import CaseStore, create_pool
    from service.trail import format_trail

    try:
        parsed = uuid.UUID(case_id)
    except ValueError:
        typer.echo(f"not a case id: {case_id!r}", err=True)
        raise typer.Exit(2) from None

    async def read(settings: Settings) -> list[dict[str, object]]:
        pool = await create_pool(settings.database_url, max_size=1)
        try:
            return [e.as_json() for e in await CaseStore(pool).find_by_case_and_types(parsed)]
        finally:
            await pool.close()

    events = _run(read(get_settings()))
    if not events:
        typer.echo(f"no events for case {case_id}", err=True)
        raise typer.Exit(1)
    if raw:
        typer.echo(orjson.dumps(events, option=orjson.OPT_INDENT_2).decode())
    else:
        typer.echo(format_trail(case_id, events))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
