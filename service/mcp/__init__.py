"""MCP servers' tools as WorkerTools (docs/design.md, "MCP tools").

An operator configures MCP servers (``CASETRAIL_MCP_SERVERS``); each is served by the
capability ``mcp-<server>``, whose capability worker holds the MCP client session
(``service/mcp/session.py``) and answers two kinds of request on that capability's
queue: ``catalog`` (the tools it serves: name, description, ``inputSchema``, its
digest, whether a retry is safe) and ``call``. An agent names the tools it may use
(``McpTool(server, tool)``); when a case starts, the worker reads the catalog
(``Catalogs``) and offers the model exactly what it says, so every call rides the bus
with its timeout, idempotency key, distribution and audit like any WorkerTool.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from casetrail.contract.events import McpCatalogRead
from casetrail.engine.tools import (
    McpBinding,
    ToolSource,
    WorkerRuntime,
    WorkerTool,
    mcp_capability,
)
from casetrail.telemetry import metrics

log = logging.getLogger("casetrail.mcp")

CATALOG_SECONDS = 30.0
"""How often a server's tools are listed again: by its capability worker while a
session is open, and by a worker asking that capability worker."""
UNREADABLE_SECONDS = 5.0
"""How long a catalog that could not be read (or is stale) stays so before it is asked
for again."""
FIRST_READ_SECONDS = 2.0
"""How long a case start waits for a server's very first catalog read (a worker reads
every configured server's when it starts)."""
STARTUP_READ_SECONDS = 10.0
"""How long a worker starting waits for its servers' first catalog reads before it takes
cases (a server still starting then is read behind the cases)."""


class _Camel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class McpRequest(_Camel):
    """The arguments of a request to the capability ``mcp-<server>``."""

    op: Literal["call", "catalog"]
    tool: str | None = Field(default=None, description="call: the tool's name on the server.")
    arguments: dict[str, Any] = Field(default_factory=dict)
    schema_digest: str | None = Field(default=None, description="call: the digest of the "
                                      "schema the model was offered; another one now is an "
                                      "error, not a call.")
    idempotency_key: str | None = Field(default=None, description="call: sent to the server "
                                        "as _meta['casetrail/idempotencyKey'].")


class CatalogTool(_Camel):
    """One tool of a server's catalog."""

    name: str
    description: str = ""
    input_schema: dict[str, Any]
    schema_digest: str
    retryable: bool = Field(description="The server annotates it readOnlyHint or "
                            "idempotentHint: a failed call may be sent again.")
    read_only: bool = Field(default=False, description="The server annotates it "
                            "readOnlyHint: it changes nothing where it runs, so a "
                            "backtest under the tool policy live may ask it.")


class Catalog(_Camel):
    """What one MCP server's capability worker serves, as it last listed it."""

    server: str
    tools: list[CatalogTool]
    read_at: datetime | None = Field(default=None, description="When the capability worker "
                                     "last listed the server's tools.")
    stale: bool = Field(default=False, description="The server is down now: these are the "
                        "tools it served when it was last read.")
    problem: str | None = Field(default=None, description="stale: why it cannot be read.")


@dataclass
class _Read:
    catalog: Catalog | None
    problem: str | None
    at: float


@dataclass
class Catalogs:
    """The worker's view of the MCP servers' catalogs (docs/design.md, "MCP tools"),
    read over the bus and kept fresh in the background: a case start takes what is
    kept and never waits on a server (only on a server's very first read, and at most
    ``FIRST_READ_SECONDS``); a catalog older than ``ttl`` is read again behind it. A
    catalog that cannot be read is replaced by the last one read, marked stale, and
    without one the server's tools fail every call with the reason. What each case was
    offered — the catalog's age, whether it was stale, why, the tools it lacked — goes
    on its record (``CASE_STARTED.mcpCatalogs``)."""

    runtime: WorkerRuntime
    ttl: float = CATALOG_SECONDS
    first_read: float = FIRST_READ_SECONDS
    _read: dict[str, _Read] = field(default_factory=dict)
    _reading: dict[str, asyncio.Future[_Read]] = field(default_factory=dict)

    def warm(self, servers: Sequence[str]) -> None:
        """Start reading ``servers``' catalogs now (a worker starting), so the first
        case finds them read."""
        for server in servers:
            self._refresh(server, None)

    async def settled(self, within: float) -> None:
        """Wait (at most ``within`` seconds) for the reads under way: a worker starting
        takes no case before its servers' first catalogs are in."""
        reading = list(self._reading.values())
        if reading:
            await asyncio.wait(reading, timeout=within)

    async def resolve(self, tools: Sequence[ToolSource]) -> list[ToolSource]:
        """``tools`` with every MCP tool described by its server's catalog; one the
        catalog does not hold is not offered."""
        return (await self.offer(tools))[0]

    async def offer(self, tools: Sequence[ToolSource]
                    ) -> tuple[list[ToolSource], tuple[McpCatalogRead, ...]]:
        """``resolve``, with the record of each server's catalog as it was offered."""
        servers = sorted({t.mcp.server for t in tools if isinstance(t, WorkerTool) and t.mcp})
        if not servers:
            return list(tools), ()
        read = dict(zip(servers, await asyncio.gather(*(self._catalog(s) for s in servers)),
                        strict=True))
        resolved: list[ToolSource] = []
        lacking: dict[str, list[str]] = {server: [] for server in servers}
        for tool in tools:
            if not isinstance(tool, WorkerTool) or tool.mcp is None:
                resolved.append(tool)
                continue
            found = read[tool.mcp.server]
            if found.catalog is None:
                resolved.append(replace(tool, mcp=replace(tool.mcp, unavailable=(
                    f"the MCP server {tool.mcp.server} could not be reached when this case "
                    f"started: {found.problem}"))))
                continue
            entry = next((t for t in found.catalog.tools if t.name == tool.mcp.tool), None)
            if entry is None:
                log.warning("MCP server %s does not serve %r: not offered", tool.mcp.server,
                            tool.mcp.tool)
                lacking[tool.mcp.server].append(tool.mcp.tool)
                continue
            resolved.append(replace(tool, description=entry.description or tool.description,
                                    read_only=tool.read_only or entry.read_only,
                                    mcp=McpBinding(tool.mcp.server, entry.name,
                                                   entry.input_schema, entry.schema_digest,
                                                   entry.retryable)))
        return resolved, tuple(_record(s, read[s], lacking[s]) for s in servers)

    async def _catalog(self, server: str) -> _Read:
        kept = self._read.get(server)
        if kept is not None:
            fresh = kept.catalog is not None and not kept.catalog.stale
            if time.monotonic() - kept.at >= (self.ttl if fresh else UNREADABLE_SECONDS):
                self._refresh(server, kept)  # behind this case: it takes what is kept
            return kept
        try:
            return await asyncio.wait_for(asyncio.shield(self._refresh(server, None)),
                                          self.first_read)
        except TimeoutError:  # the cases after this one do not wait for it either
            return self._read.setdefault(server, _Read(
                None, f"its catalog was still being read for the first time after "
                f"{self.first_read:g} s", time.monotonic()))

    def _refresh(self, server: str, kept: _Read | None) -> asyncio.Future[_Read]:
        reading = self._reading.get(server)
        if reading is None:  # one read at a time per server, whoever asks
            reading = self._reading[server] = asyncio.ensure_future(self._fetch(server, kept))
            reading.add_done_callback(lambda _: self._reading.pop(server, None))
        return reading

    async def _fetch(self, server: str, kept: _Read | None) -> _Read:
        outcome = await self.runtime.execute(
            mcp_capability(server), {"op": "catalog"}, call_id=f"catalog:{uuid.uuid4()}",
            retry=False)
        if outcome.ok:
            read = _Read(Catalog.model_validate(outcome.result), None, time.monotonic())
        elif kept is not None and kept.catalog is not None:
            log.warning("MCP server %s: catalog not read (%s); offering the one read at %s, "
                        "marked stale", server, outcome.error, kept.catalog.read_at)
            read = _Read(kept.catalog.model_copy(update={"stale": True,
                                                         "problem": outcome.error}),
                         outcome.error, time.monotonic())
        else:
            read = _Read(None, outcome.error, time.monotonic())
        self._read[server] = read
        return read


def _record(server: str, read: _Read, lacking: list[str]) -> McpCatalogRead:
    """What a case was offered of ``server``'s catalog, for its ``CASE_STARTED``."""
    catalog = read.catalog
    if catalog is None or catalog.read_at is None:
        return McpCatalogRead(server=server, stale=True, problem=read.problem,
                              not_served=tuple(lacking))
    age = max(0.0, (datetime.now(UTC) - catalog.read_at).total_seconds())
    metrics.MCP_CATALOG_AGE_SECONDS.labels(server).set(age)
    return McpCatalogRead(server=server, read_at=catalog.read_at, age_seconds=round(age, 3),
                          stale=catalog.stale, problem=catalog.problem,
                          not_served=tuple(lacking))


__all__ = ["Catalog", "CatalogTool", "Catalogs", "McpRequest"]
