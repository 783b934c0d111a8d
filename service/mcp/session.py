"""The capability worker's side of one MCP server: a client session of the official
``mcp`` SDK, opened on first use, kept open, and opened again when it breaks (a stdio
server is started again; an HTTP one is reached again), serving the capability
``mcp-<server>``.

A server that is down is a failed call (``ToolFailed``), never a stopped worker. A call
is retried by the worker only when the server annotates the tool ``readOnlyHint`` or
``idempotentHint``; a request for any other tool that comes back from a worker that
stopped holding it is refused (``at_most_once``): it may have run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from casetrail.config import McpServer
from casetrail.engine.tools import (
    Capability,
    ToolFailed,
    mcp_capability,
    schema_digest,
)
from casetrail.errors import PermanentError
from casetrail.mcp import Catalog, CatalogTool, McpRequest

if TYPE_CHECKING:
    from contextlib import AbstractAsyncContextManager

    from mcp import ClientSession
    from mcp.types import CallToolResult

log = logging.getLogger("casetrail.mcp")

IDEMPOTENCY_META = "casetrail/idempotencyKey"
"""The ``_meta`` key of a call that holds its idempotency key, for a server that keeps
its own record of what it did."""


def _described(exc: BaseException) -> str:
    """An exception as one line; an exception group by its first leaf."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _text(result: CallToolResult) -> str:
    parts = [getattr(block, "text", None) or f"[{block.type} content]"
             for block in result.content]
    return "\n".join(parts)


class ServerSession:
    """One MCP server as its capability worker sees it."""

    def __init__(self, server: McpServer) -> None:
        self.server = server
        self._session: ClientSession | None = None
        self._ready = asyncio.Event()
        self._broken = asyncio.Event()
        self._closing = False
        self._keeper: asyncio.Task[None] | None = None
        self._problem = "not connected yet"
        self._tools: dict[str, CatalogTool] = {}

    @property
    def _wait(self) -> float:
        """How long a request waits for a session that is not open yet."""
        return min(5.0, self.server.timeout_seconds / 2)

    async def answer(self, request: McpRequest) -> Any:
        if request.op == "catalog":
            return (await self.catalog()).model_dump(mode="json", by_alias=True)
        return await self.call(request)

    def at_most_once(self, args: Mapping[str, Any]) -> bool:
        """A call of a tool not known to be safe to run twice."""
        if args.get("op") != "call":
            return False
        known = self._tools.get(str(args.get("tool")))
        return known is None or not known.retryable

    async def catalog(self) -> Catalog:
        await self._refresh(await self._open())
        return Catalog(server=self.server.name, tools=list(self._tools.values()))

    async def _refresh(self, session: ClientSession) -> None:
        """Read the server's tools again (nothing is called: a failure is retryable)."""
        try:
            self._tools = await self._list(session)
        except Exception as exc:
            raise self._broke(exc, retryable=True) from exc

    async def call(self, request: McpRequest) -> Any:
        from mcp.shared.exceptions import McpError
        from mcp.types import CONNECTION_CLOSED

        session = await self._open()
        name, entry = request.tool or "", self._tools.get(request.tool or "")
        if entry is None or entry.schema_digest != request.schema_digest:
            # the server may have changed since its catalog was read: ask it
            await self._refresh(session)
            entry = self._tools.get(name)
        if entry is None:
            raise ToolFailed(f"the MCP server {self.server.name} serves no tool {name!r} "
                             f"(it serves: {', '.join(sorted(self._tools)) or 'none'})",
                             retryable=False)
        if entry.schema_digest != request.schema_digest:
            raise ToolFailed(f"the inputSchema of {name!r} changed since it was offered to the "
                             f"model (offered {request.schema_digest}, now "
                             f"{entry.schema_digest}): not called", retryable=False)
        meta = None if request.idempotency_key is None else {
            IDEMPOTENCY_META: request.idempotency_key}
        try:
            result = await session.call_tool(
                name, request.arguments, meta=meta,
                read_timeout_seconds=timedelta(seconds=self.server.timeout_seconds))
        except McpError as exc:
            if exc.error.code in (CONNECTION_CLOSED, 408):  # closed, or no answer in time
                raise self._broke(exc, retryable=entry.retryable, sent=True) from exc
            raise ToolFailed(f"the MCP server {self.server.name} refused the call: "
                             f"{exc.error.message} (code {exc.error.code})",
                             retryable=False) from exc
        except Exception as exc:
            raise self._broke(exc, retryable=entry.retryable, sent=True) from exc
        if result.isError:
            raise ToolFailed(_text(result) or f"{name} reported an error", retryable=False)
        return result.structuredContent if result.structuredContent is not None \
            else _text(result)

    def _broke(self, exc: BaseException, *, retryable: bool, sent: bool = False
               ) -> ToolFailed:
        """The session is broken: the keeper opens a new one; the failure, for the call."""
        self._problem = _described(exc)
        self._session = None  # nobody else uses it while the keeper opens another
        self._ready.clear()
        self._broken.set()
        reason = f"the MCP server {self.server.name} is unavailable: {self._problem}"
        if sent and not retryable:
            reason += ("; the call may or may not have run, and its tool is not annotated "
                       "read-only or idempotent: it is not sent again")
        return ToolFailed(reason, retryable=retryable)

    async def _open(self) -> ClientSession:
        """The open session, waiting a little for one being opened."""
        if self._keeper is None or self._keeper.done():
            self._keeper = asyncio.create_task(self._keep(), name=f"mcp-{self.server.name}")
        loop = asyncio.get_running_loop()
        until = loop.time() + self._wait
        while self._session is None or not self._ready.is_set():
            if loop.time() >= until:  # nothing was sent: a retry is always safe
                raise ToolFailed(f"the MCP server {self.server.name} is unavailable: "
                                 f"{self._problem}", retryable=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ready.wait(), until - loop.time())
        return self._session

    async def _keep(self) -> None:
        """Open a session and hold it until it breaks, then open another (backing off),
        until ``close``."""
        from mcp import ClientSession
        from mcp.types import Implementation

        delay = 0.2
        while not self._closing:
            try:
                async with self._transport() as streams, ClientSession(
                        streams[0], streams[1],
                        read_timeout_seconds=timedelta(seconds=self.server.timeout_seconds),
                        client_info=Implementation(name="casetrail", version="1")) as session:
                    await session.initialize()
                    self._tools = await self._list(session)
                    self._session, delay = session, 0.2
                    self._ready.set()
                    log.info("MCP server %s: session open, %d tools", self.server.name,
                             len(self._tools))
                    await self._broken.wait()
            except Exception as exc:
                self._problem = _described(exc)
                log.warning("MCP server %s: %s", self.server.name, self._problem)
            finally:
                self._session = None
                self._ready.clear()
                self._broken.clear()
            if not self._closing:
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    def _transport(self) -> AbstractAsyncContextManager[tuple[Any, ...]]:
        server = self.server
        if server.transport == "stdio":
            from mcp.client.stdio import (
                StdioServerParameters,
                get_default_environment,
                stdio_client,
            )

            assert server.command is not None
            return stdio_client(StdioServerParameters(
                command=server.command[0], args=server.command[1:],
                env={**get_default_environment(), **server.from_environment(server.env)}))
        from mcp.client.streamable_http import streamablehttp_client

        assert server.url is not None
        return streamablehttp_client(server.url,
                                     headers=server.from_environment(server.headers_env),
                                     timeout=server.timeout_seconds)

    async def _list(self, session: ClientSession) -> dict[str, CatalogTool]:
        from mcp.types import PaginatedRequestParams

        tools: dict[str, CatalogTool] = {}
        cursor: str | None = None
        while True:
            page = await session.list_tools(
                params=None if cursor is None else PaginatedRequestParams(cursor=cursor))
            for tool in page.tools:
                hints = tool.annotations
                tools[tool.name] = CatalogTool(
                    name=tool.name, description=tool.description or "",
                    input_schema=tool.inputSchema, schema_digest=schema_digest(tool.inputSchema),
                    retryable=bool(hints and (hints.readOnlyHint or hints.idempotentHint)))
            cursor = page.nextCursor
            if not cursor:
                return tools

    async def close(self) -> None:
        self._closing = True
        self._broken.set()
        if self._keeper is not None:
            done, _ = await asyncio.wait({self._keeper}, timeout=5)
            if not done:
                self._keeper.cancel()
                with contextlib.suppress(BaseException):
                    await self._keeper


def serving(server: McpServer) -> Capability[McpRequest]:
    """The capability ``mcp-<server>``: its requests answered through one session."""
    session = ServerSession(server)
    return Capability(mcp_capability(server.name), McpRequest, session.answer,
                      at_most_once=session.at_most_once, close=session.close,
                      remembered=_a_call)


def _a_call(args: Mapping[str, Any]) -> bool:
    """A call's reply is kept for its retries; a catalog read is asked afresh each time."""
    return args.get("op") == "call"


async def read_catalogs(servers: list[McpServer]) -> dict[str, Catalog | str]:
    """Each server's catalog as a capability worker would read it (or why it could not
    be read): for an operator checking a configuration (``casetrail mcp-tools``)."""
    read: dict[str, Catalog | str] = {}
    for server in servers:
        session = ServerSession(server)
        try:
            read[server.name] = await session.catalog()
        except (ToolFailed, PermanentError) as exc:
            read[server.name] = str(exc)
        finally:
            await session.close()
    return read
