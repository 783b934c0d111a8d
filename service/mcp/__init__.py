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
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from casetrail.engine.tools import (
    Capability,
    McpBinding,
    ToolSource,
    WorkerRuntime,
    WorkerTool,
    mcp_capability,
)

log = logging.getLogger("casetrail.mcp")

CATALOG_SECONDS = 30.0
"""How long a worker offers a catalog it read before it asks again."""
UNREADABLE_SECONDS = 5.0
"""How long a catalog that could not be read stays so before it is asked for again."""


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


class Catalog(_Camel):
    """What one MCP server's capability worker serves."""

    server: str
    tools: list[CatalogTool]


@dataclass
class _Read:
    catalog: Catalog | None
    problem: str | None
    at: float


@dataclass
class Catalogs:
    """The worker's view of the MCP servers' catalogs: read over the bus when a case
    needs one, kept ``ttl`` seconds; a catalog that cannot be read is replaced by the
    last one read, and without one the server's tools fail every call with the reason."""

    runtime: WorkerRuntime
    ttl: float = CATALOG_SECONDS
    _read: dict[str, _Read] = field(default_factory=dict)
    _reading: dict[str, asyncio.Future[_Read]] = field(default_factory=dict)

    async def resolve(self, tools: Sequence[ToolSource]) -> list[ToolSource]:
        """``tools`` with every MCP tool described by its server's catalog; one the
        catalog does not hold is not offered."""
        servers = {t.mcp.server for t in tools if isinstance(t, WorkerTool) and t.mcp}
        if not servers:
            return list(tools)
        read = dict(zip(servers, await asyncio.gather(*(self._catalog(s) for s in servers)),
                        strict=True))
        resolved: list[ToolSource] = []
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
                continue
            resolved.append(replace(tool, description=entry.description or tool.description,
                                    mcp=McpBinding(tool.mcp.server, entry.name,
                                                   entry.input_schema, entry.schema_digest,
                                                   entry.retryable)))
        return resolved

    async def _catalog(self, server: str) -> _Read:
        kept = self._read.get(server)
        if kept is not None and time.monotonic() - kept.at < (
                self.ttl if kept.catalog is not None else UNREADABLE_SECONDS):
            return kept
        reading = self._reading.get(server)
        if reading is None:  # one read at a time per server, whoever asks
            reading = self._reading[server] = asyncio.ensure_future(self._fetch(server, kept))
            reading.add_done_callback(lambda _: self._reading.pop(server, None))
        return await asyncio.shield(reading)

    async def _fetch(self, server: str, kept: _Read | None) -> _Read:
        outcome = await self.runtime.execute(
            mcp_capability(server), {"op": "catalog"}, call_id=f"catalog:{uuid.uuid4()}",
            retry=False)
        if outcome.ok:
            read = _Read(Catalog.model_validate(outcome.result), None, time.monotonic())
        elif kept is not None and kept.catalog is not None:
            log.warning("MCP server %s: catalog not read (%s); offering the one read %.0f s "
                        "ago", server, outcome.error, time.monotonic() - kept.at)
            return kept
        else:
            read = _Read(None, outcome.error, time.monotonic())
        self._read[server] = read
        return read


def mcp_capabilities(servers: Sequence[Any]) -> list[Capability[Any]]:
    """The capabilities of the configured MCP servers (``McpServer`` settings), for the
    registry; the SDK is loaded only by a capability worker that serves one."""
    from casetrail.mcp.session import serving

    return [serving(server) for server in servers]


__all__ = ["Catalog", "CatalogTool", "Catalogs", "McpRequest", "mcp_capabilities"]
