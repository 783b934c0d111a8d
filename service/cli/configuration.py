"""``casetrail agents``, ``mcp-tools``, ``a2a-agents`` and ``check``: what this
installation runs, and whether each agent can run as it is configured
(service/cases/configured.py). Each exits non-zero naming what is wrong."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import orjson
import typer

from casetrail.cli.common import configure_logging
from casetrail.cli.common import run as run_async
from casetrail.config import get_settings

if TYPE_CHECKING:
    from casetrail.agents import Registry
    from casetrail.mcp import Catalog


def _found() -> Registry:
    from casetrail.agents import PluginError, registry

    try:
        return registry()
    except PluginError as exc:
        typer.echo(f"casetrail: {exc}", err=True)
        raise typer.Exit(2) from None


def _unconfigured(found: Registry) -> dict[str, list[str]]:
    from casetrail.cases.configured import misconfigured

    return misconfigured(found.agents, get_settings(), found.capabilities)


def agents(
    raw: Annotated[bool, typer.Option("--json", help="Print them as JSON.")] = False,
) -> None:
    """The agents and capabilities this installation runs (built in, from installed
    packages' entry points, or named in CASETRAIL_AGENTS) and where each came from.
    Exit 2 when one does not load, 1 when one is not configured to run here (an MCP
    server, a capability or a model endpoint it names is not configured), naming why."""
    found = _found()
    unconfigured = _unconfigured(found)
    listed: dict[str, list[dict[str, Any]]] = {
        "agents": [{"name": a.name, "version": a.version, "from": found.origins[f"agent:{name}"],
                    "tools": [t.name for t in a.tools],
                    "scripted": a.script is not None,
                    "problems": unconfigured.get(name, [])}
                   for name, a in found.agents.items()],
        "capabilities": [{"name": name, "from": found.origins[f"capability:{name}"]}
                         for name in found.capabilities]}
    if raw:
        typer.echo(orjson.dumps(listed, option=orjson.OPT_INDENT_2).decode())
    else:
        for agent in listed["agents"]:
            typer.echo(f"agent {agent['name']} {agent['version']}  tools: "
                       f"{', '.join(agent['tools']) or '-'}  from {agent['from']}")
        for capability in listed["capabilities"]:
            typer.echo(f"capability {capability['name']}  from {capability['from']}")
    _refuse(unconfigured)


def _refuse(unconfigured: dict[str, list[str]]) -> None:
    from casetrail.cases.configured import described

    for name, problems in unconfigured.items():
        typer.echo(f"casetrail: {described(name, problems)}", err=True)
    if unconfigured:
        raise typer.Exit(1)


def _catalogs() -> dict[str, Catalog | str]:
    from casetrail.mcp.session import read_catalogs

    configure_logging("WARNING")
    return run_async(read_catalogs(get_settings().mcp_servers))


def mcp_tools(
    raw: Annotated[bool, typer.Option("--json", help="Print the catalogs as JSON.")] = False,
) -> None:
    """The tools each configured MCP server (CASETRAIL_MCP_SERVERS) serves, read as a
    capability worker reads them: the name the model sees, and whether a failed call is
    retried. Exit 2 when a server cannot be reached, naming why."""
    from casetrail.engine.tools import mcp_tool_name

    read = _catalogs()
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


def check() -> None:
    """Whether every agent can run as this deployment is configured: each MCP server,
    capability and model endpoint it names is configured, and each MCP tool it names is
    served (the servers are asked, as a capability worker asks them). Exit 1 naming each
    reason. A configured server that cannot be reached now is reported, not refused: a
    worker offers its last catalog, marked stale on the record."""
    from casetrail.engine.tools import WorkerTool

    found = _found()
    unconfigured = _unconfigured(found)
    read = _catalogs() if any(
        isinstance(t, WorkerTool) and t.mcp is not None
        for a in found.agents.values() for t in a.tools) else {}
    for name, catalog in read.items():
        if isinstance(catalog, str):
            typer.echo(f"casetrail: MCP server {name!r} cannot be reached now ({catalog}); "
                       "its tools are not checked", err=True)
    for name, agent in found.agents.items():
        for tool in agent.tools:
            if not isinstance(tool, WorkerTool) or tool.mcp is None:
                continue
            offered = read.get(tool.mcp.server)
            if offered is None or isinstance(offered, str):
                continue
            serves = sorted(t.name for t in offered.tools)
            if tool.mcp.tool not in serves:
                unconfigured.setdefault(name, []).append(
                    f"tool {tool.name!r}: the MCP server {tool.mcp.server!r} does not serve "
                    f"{tool.mcp.tool!r} (it serves: {', '.join(serves) or 'nothing'})")
    _refuse(unconfigured)
    typer.echo(f"casetrail: {len(found.agents)} agents can run as configured")


def a2a_agents(
    raw: Annotated[bool, typer.Option("--json", help="Print them as JSON.")] = False,
) -> None:
    """Each configured remote A2A agent (CASETRAIL_A2A_AGENTS): the digest of the card it
    serves now beside the one pinned (cardDigest), to pin a new agent or accept a changed
    card. Exit 1 when a card is not the pinned one, 2 when one cannot be read."""
    from casetrail.a2a.remote import read_cards

    configure_logging()
    read = run_async(read_cards(get_settings().a2a_agents))
    if raw:
        typer.echo(orjson.dumps(read, option=orjson.OPT_INDENT_2).decode())
    for name, card in read.items():
        if isinstance(card, str):
            typer.echo(f"agent {name}: {card}", err=True)
        elif not raw:
            verdict = "pinned" if card["accepted"] else (
                "NOT PINNED" if card["pinned"] is None else f"CHANGED (pinned {card['pinned']})")
            typer.echo(f"{name}  card {card['served']}  {verdict}")
    if not read:
        typer.echo("no A2A agents are configured (CASETRAIL_A2A_AGENTS)", err=True)
    unread = any(isinstance(card, str) for card in read.values())
    raise typer.Exit(2 if unread else 1 if any(not card["accepted"] for card in read.values()
                                                if isinstance(card, dict)) else 0)
