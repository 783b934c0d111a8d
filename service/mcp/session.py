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
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, cast

from casetrail.config import McpServer
from casetrail.engine.tools import (
    Capability,
    ToolFailed,
    mcp_capability,
    schema_digest,
)
from casetrail.errors import PermanentError
from casetrail.extras import missing
from casetrail.mcp import CATALOG_SECONDS, Catalog, CatalogTool, McpRequest
from casetrail.mcp.breaker import Breaker
from casetrail.mcp.content import recorded, text_of

if TYPE_CHECKING:
    from contextlib import AbstractAsyncContextManager

    from mcp import ClientSession
    from mcp.types import RequestParamsMeta

log = logging.getLogger("casetrail.mcp")

STREAM_SECONDS = 300.0
"""How long the HTTP client waits on a server's event stream between events (a request's
own answer is bounded by the server's ``timeoutSeconds``)."""

IDEMPOTENCY_META = "casetrail/idempotencyKey"
"""The ``_meta`` key of a call that holds its idempotency key, for a server that keeps
its own record of what it did."""


def _described(exc: BaseException) -> str:
    """An exception as one line; an exception group by its first leaf."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class ServerSession:
    """One MCP server as its capability worker sees it."""

    def __init__(self, server: McpServer) -> None:
        self.server = server
        self._session: ClientSession | None = None
        self._ready = asyncio.Event()
        self._news = asyncio.Event()  # the keeper opened a session or failed to
        self._broken = asyncio.Event()
        self._closing = False
        self._keeper: asyncio.Task[None] | None = None
        self._problem = "not connected yet"
        self._refused: str | None = None  # the last HTTP refusal, which the SDK does not name
        self._tools: dict[str, CatalogTool] = {}
        self._read_at: datetime | None = None  # when the server's tools were last listed
        self.breaker = Breaker(server.name)

    @property
    def protocol_version(self) -> str | None:
        """The protocol version the open session negotiated (none while closed)."""
        session = self._session
        result = None if session is None else session.initialize_result
        return None if result is None else str(result.protocol_version)

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
        """The server's tools, listed now while a session is open (workers ask in the
        background, never while a case waits); while the server is down, the tools as
        last listed, ``stale`` with the reason, at once (the circuit is open)."""
        if self._read_at is None:  # never read: wait for the first session to open or fail
            await self._open(first=True)
        if (session := self._session) is not None and self._ready.is_set():
            with contextlib.suppress(ToolFailed):  # broken now: answered stale below
                await self._refresh(session)
        up = self._ready.is_set()
        return Catalog(server=self.server.name, tools=list(self._tools.values()),
                       read_at=self._read_at, stale=not up,
                       problem=None if up else self._problem)

    async def _refresh(self, session: ClientSession) -> None:
        """Read the server's tools again (nothing is called: a failure is retryable)."""
        try:
            self._listed(await self._list(session))
        except Exception as exc:
            raise self._broke(exc, retryable=True) from exc

    def _listed(self, tools: dict[str, CatalogTool]) -> None:
        self._tools, self._read_at = tools, datetime.now(UTC)

    async def call(self, request: McpRequest) -> Any:
        from mcp.shared.exceptions import MCPError
        from mcp.types import CONNECTION_CLOSED, REQUEST_TIMEOUT

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
        meta: RequestParamsMeta | None = None if request.idempotency_key is None else cast(
            "RequestParamsMeta", {IDEMPOTENCY_META: request.idempotency_key})
        try:
            result = await session.call_tool(
                name, request.arguments, meta=meta,
                read_timeout_seconds=self.server.timeout_seconds)
        except MCPError as exc:
            if exc.error.code in (CONNECTION_CLOSED, REQUEST_TIMEOUT):  # closed, or no answer
                raise self._broke(exc, retryable=entry.retryable, sent=True) from exc
            raise ToolFailed(f"the MCP server {self.server.name} refused the call: "
                             f"{exc.error.message} (code {exc.error.code})",
                             retryable=False) from exc
        except Exception as exc:
            raise self._broke(exc, retryable=entry.retryable, sent=True) from exc
        if result.is_error:
            raise ToolFailed(text_of(result) or f"{name} reported an error", retryable=False)
        return recorded(result)

    def _broke(self, exc: BaseException, *, retryable: bool, sent: bool = False
               ) -> ToolFailed:
        """The session is broken: the keeper opens a new one; the failure, for the call."""
        self._problem = self._with_refusal(_described(exc))
        self._session = None  # nobody else uses it while the keeper opens another
        self._ready.clear()
        self._broken.set()
        reason = f"the MCP server {self.server.name} is unavailable: {self._problem}"
        if sent and not retryable:
            reason += ("; the call may or may not have run, and its tool is not annotated "
                       "read-only or idempotent: it is not sent again")
        return ToolFailed(reason, retryable=retryable)

    async def _open(self, *, first: bool = False) -> ClientSession:
        """The open session, waiting a little for one being opened; ``first`` (the
        server's tools never listed): waiting for one attempt to open it, as long as the
        server's timeout, so a server slow to start is not taken for a dead one."""
        if self._keeper is None or self._keeper.done():
            if why := missing("mcp"):  # nothing could ever open: said at once, not retried
                raise ToolFailed(f"the MCP server {self.server.name} cannot be reached: "
                                 f"{why}", retryable=False)
            self._keeper = asyncio.create_task(self._keep(), name=f"mcp-{self.server.name}")
        loop = asyncio.get_running_loop()
        until = loop.time() + (self.server.timeout_seconds if first else self._wait)
        failed = self.breaker.failures
        while self._session is None or not self._ready.is_set():
            self._news.clear()  # then checked: the keeper's next news wakes this wait
            if self.breaker.fails_fast:  # down: no call waits for it
                raise ToolFailed(f"the MCP server {self.server.name} is unavailable: "
                                 f"{self._problem} (circuit {self.breaker.state.replace('_', '-')}"
                                 f" after {self.breaker.failures} failed connections: its "
                                 "calls fail at once until it answers)", retryable=True)
            if loop.time() >= until or (first and self.breaker.failures > failed):
                # nothing was sent: a retry is always safe
                raise ToolFailed(f"the MCP server {self.server.name} is unavailable: "
                                 f"{self._problem}", retryable=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._news.wait(), until - loop.time())
        return self._session

    async def _keep(self) -> None:
        """Open a session and hold it until it breaks, then open another (backing off),
        until ``close``."""
        from mcp import ClientSession
        from mcp.types import Implementation

        delay = 0.2
        while not self._closing:
            self.breaker.trying_again()
            try:
                async with self._transport() as streams, ClientSession(
                        streams[0], streams[1],
                        read_timeout_seconds=self.server.timeout_seconds,
                        client_info=Implementation(name="casetrail", version="1")) as session:
                    await session.initialize()
                    self._listed(await self._list(session))
                    self._session, delay = session, 0.2
                    self._ready.set()
                    self._news.set()
                    self.breaker.session_opened()
                    log.info("MCP server %s: session open, %d tools", self.server.name,
                             len(self._tools))
                    await self._hold(session)
            except Exception as exc:
                self._problem = self._with_refusal(_described(exc))
                self.breaker.session_failed()
                self._news.set()
                log.warning("MCP server %s: %s", self.server.name, self._problem)
            finally:
                self._session = None
                self._ready.clear()
                self._broken.clear()
            if not self._closing:
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _hold(self, session: ClientSession) -> None:
        """Until the session breaks: list the server's tools again every
        ``CATALOG_SECONDS`` (a failure breaks it)."""
        while not self._broken.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._broken.wait(), CATALOG_SECONDS)
                return
            with contextlib.suppress(ToolFailed):
                await self._refresh(session)

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
        return _over_http(server, self._note_refusal)

    def _note_refusal(self, status: int, reason: str) -> None:
        self._refused = f"HTTP {status} {reason}".strip()

    def _with_refusal(self, problem: str) -> str:
        refused, self._refused = self._refused, None
        return problem if refused is None else f"{problem} ({refused})"

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
                    input_schema=tool.input_schema,
                    schema_digest=schema_digest(tool.input_schema),
                    retryable=bool(hints and (hints.read_only_hint or hints.idempotent_hint)),
                    read_only=bool(hints and hints.read_only_hint))
            cursor = page.next_cursor
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


@contextlib.asynccontextmanager
async def _over_http(server: McpServer, refused: Callable[[int, str], None]
                     ) -> AsyncIterator[tuple[Any, ...]]:
    """Streamable HTTP to ``server`` through an HTTP client of its own (its headers from
    the environment), closed with the transport; each answer of 400 or more is told to
    ``refused`` (the SDK reports it as a bare "error response")."""
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    async def noted(response: httpx2.Response) -> None:
        if response.status_code >= 400:
            refused(response.status_code, response.reason_phrase)

    assert server.url is not None
    async with httpx2.AsyncClient(
            headers=server.from_environment(server.headers_env),
            event_hooks={"response": [noted]},
            timeout=httpx2.Timeout(server.timeout_seconds, read=STREAM_SECONDS)) as client, \
            streamable_http_client(server.url, http_client=client) as streams:
        yield streams


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
