"""Tools: a closed union of two kinds, and the dispatch that runs them.

``ToolSource = WorkerTool | LocalTool``. A ``LocalTool`` is a plain function
called in process; a ``WorkerTool`` names a capability that a
``WorkerRuntime`` executes (in process for tests, over RabbitMQ in the
service). Dispatch is a ``match`` with ``assert_never``: add a third kind and
the type checker fails until it is handled.

A tool failure is an *observation*: the model is told what went wrong and the
record carries ``error`` with no invented result.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import inspect
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Generic, Protocol, TypeAlias, TypeVar, assert_never

import orjson
from jsonschema import validators as json_schema_validators
from jsonschema.exceptions import SchemaError, best_match
from pydantic import BaseModel, ValidationError

from casetrail.contract.events import (
    A2aCallRef,
    McpCallRef,
    McpCatalogRead,
    ToolAttempt,
    ToolCallRecord,
    describe_validation_error,
)
from casetrail.contract.integrity import canonical
from casetrail.engine.chat import ToolCallRequest, ToolResultMessage, ToolSpec
from casetrail.engine.observing import NO_OBSERVER, Observer

ArgsT = TypeVar("ArgsT", bound=BaseModel)


@functools.cache
def _schema(args_model: type[BaseModel]) -> dict[str, Any]:
    return args_model.model_json_schema()


@functools.cache
def _schema_digest(args_model: type[BaseModel]) -> str:
    return schema_digest(_schema(args_model))


def schema_digest(schema: dict[str, Any]) -> str:
    """SHA-256 (hex) of a tool's argument schema as RFC 8785 canonical JSON."""
    return hashlib.sha256(canonical(schema)).hexdigest()


TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
"""What every provider accepts as a tool's name."""


def mcp_tool_name(server: str, tool: str) -> str:
    """The model-facing name of an MCP server's tool: ``<server>_<tool>``, anything
    outside ``[a-zA-Z0-9_-]`` made ``_``, and a long one cut to 64 characters with a
    digest of the whole so that two long names stay two."""
    name = re.sub(r"[^a-zA-Z0-9_-]", "_", f"{server}_{tool}")
    if len(name) <= 64:
        return name
    return f"{name[:55]}_{hashlib.sha256(name.encode()).hexdigest()[:8]}"


@dataclass(frozen=True)
class McpBinding:
    """The MCP server's tool behind a ``WorkerTool`` (docs/design.md, "MCP tools"): named
    by the agent, described by the catalog its capability worker serves. Until the
    worker resolves it against that catalog it has no schema."""

    server: str
    tool: str
    input_schema: Mapping[str, Any] | None = field(default=None, compare=False, hash=False)
    schema_digest: str | None = None
    retryable: bool = False
    """Annotated ``readOnlyHint`` or ``idempotentHint``: only then is a call retried."""
    unavailable: str | None = None
    """Why the catalog could not be read when the case started: every call fails so."""

    @property
    def capability(self) -> str:
        return mcp_capability(self.server)


@dataclass(frozen=True)
class A2aBinding:
    """The remote A2A agent behind a ``WorkerTool`` (docs/a2a.md, "Remote agents as
    tools"): the operator's name for it (``CASETRAIL_A2A_AGENTS``), the skill asked for,
    and whether the arguments go as the message's text (``text``) or as its data part."""

    agent: str
    skill: str | None = None
    text: bool = False

    @property
    def capability(self) -> str:
        return a2a_capability(self.agent)


def a2a_capability(agent: str) -> str:
    """The capability (and queue) that calls one remote A2A agent."""
    return f"a2a-{agent}"


MCP_SERVER_NAME = r"^[a-z0-9][a-z0-9-]{0,58}$"
"""An MCP server's name in ``CASETRAIL_MCP_SERVERS`` (its capability is ``mcp-<name>``)."""


def mcp_capability(server: str) -> str:
    """The capability (and queue) that serves one MCP server's tools."""
    return f"mcp-{server}"


_VALIDATORS: dict[str, Any] = {}
"""JSON Schema validators by schema digest (a server has a handful of tools)."""


def json_schema_problem(schema: Mapping[str, Any], digest: str, value: Any) -> str | None:
    """Why ``value`` does not validate against a JSON Schema (``None`` when it does)."""
    validator = _VALIDATORS.get(digest)
    if validator is None:
        kind = json_schema_validators.validator_for(schema)
        try:
            kind.check_schema(dict(schema))
        except SchemaError as exc:
            return f"the server's inputSchema is not a valid JSON Schema: {exc.message}"
        validator = _VALIDATORS[digest] = kind(dict(schema))
    error = best_match(validator.iter_errors(value))
    if error is None:
        return None
    where = "/".join(str(part) for part in error.absolute_path) or "(arguments)"
    return f"{where}: {error.message}"


@dataclass(frozen=True)
class LocalTool(Generic[ArgsT]):
    """A plain function, sync or async, called in process with validated arguments.

    Sync functions run in a thread so they never block the event loop.
    """

    name: str
    description: str
    args_model: type[ArgsT]
    fn: Callable[[ArgsT], Any] | Callable[[ArgsT], Awaitable[Any]]

    @property
    def spec(self) -> ToolSpec:
        return ToolSpec(self.name, self.description, _schema(self.args_model))

    @property
    def schema_digest(self) -> str:
        return _schema_digest(self.args_model)


OPEN_SCHEMA: Mapping[str, Any] = {"type": "object"}


@dataclass(frozen=True)
class WorkerTool:
    """A tool executed by a capability worker through a ``WorkerRuntime``: its arguments
    are a pydantic model, or, for an MCP server's tool, the JSON Schema of the server's
    catalog (``mcp``)."""

    name: str
    description: str
    capability: str
    args_model: type[BaseModel] | None = None
    mcp: McpBinding | None = None
    a2a: A2aBinding | None = None
    """A remote A2A agent's skill: its arguments are ``args_model``, sent as a message."""
    read_only: bool = False
    """It changes nothing where it runs (a lookup): a backtest whose tool policy is
    ``live`` may ask it what the record lacks."""

    def __post_init__(self) -> None:
        if (self.args_model is None) == (self.mcp is None):
            raise TypeError(f"WorkerTool {self.name!r} needs an args_model or an MCP binding, "
                            "not both")
        if self.a2a is not None and self.a2a.capability != self.capability:
            raise TypeError(f"WorkerTool {self.name!r}: an A2A agent's tool is served by "
                            f"{self.a2a.capability!r}")

    @property
    def parameters(self) -> dict[str, Any]:
        if self.args_model is not None:
            return _schema(self.args_model)
        assert self.mcp is not None
        return dict(self.mcp.input_schema or OPEN_SCHEMA)

    @property
    def spec(self) -> ToolSpec:
        return ToolSpec(self.name, self.description, self.parameters)

    @property
    def schema_digest(self) -> str:
        if self.args_model is not None:
            return _schema_digest(self.args_model)
        assert self.mcp is not None
        return self.mcp.schema_digest or schema_digest(self.parameters)


ToolSource: TypeAlias = LocalTool[Any] | WorkerTool


@functools.cache
def _spec_of(tool: ToolSource) -> ToolSpec:
    return tool.spec


def source_label(tool: ToolSource) -> str:
    match tool:
        case LocalTool():
            return "local"
        case WorkerTool():
            return "worker"
        case _:
            assert_never(tool)


@dataclass(frozen=True)
class WorkerCallResult:
    """The outcome of ``WorkerRuntime.execute``: a result or an error, and every attempt."""

    result: Any = None
    error: str | None = None
    attempts: tuple[ToolAttempt, ...] = ()

    @property
    def ok(self) -> bool:
        return self.error is None


class WorkerRuntime(Protocol):
    """Runs a capability somewhere (in process, or on a capability worker over the bus).

    ``call_id`` is the idempotency key shared by every attempt of one call; with
    ``retry=False`` the call is sent once (a tool that may not run twice).
    Never raises for a tool failure: the failure is in the result.
    """

    async def execute(
        self, capability: str, args: Mapping[str, Any], *, call_id: str, retry: bool = True
    ) -> WorkerCallResult: ...


class ToolFailed(Exception):
    """Raised by a capability's handler: the call failed for this reason, and a retry
    could (``retryable``) or could not help. Any other exception is taken as one a retry
    may cure."""

    def __init__(self, reason: str, *, retryable: bool) -> None:
        super().__init__(reason)
        self.retryable = retryable


@dataclass(frozen=True)
class Capability(Generic[ArgsT]):
    """What a capability worker serves: a name, an argument model, an async handler."""

    name: str
    args_model: type[ArgsT]
    handler: Callable[[ArgsT], Awaitable[Any]]
    at_most_once: Callable[[Mapping[str, Any]], bool] | None = None
    """Says which requests must never run twice: one the broker hands out again (its
    worker stopped while holding it) is then refused, not run a second time."""
    close: Callable[[], Awaitable[None]] | None = None
    """Called once when the capability worker stops (connections the handler holds)."""
    remembered: Callable[[Mapping[str, Any]], bool] | None = None
    """Says which requests' replies the capability worker keeps by idempotency key (every
    one when not given): a retry of a kept one gets its answer without running again; a
    read nobody asks twice (an MCP server's catalog) need not take a place."""
    admits: Callable[[Mapping[str, Any], Mapping[str, str]], str | None] | None = None
    """Says why a request may not carry the sensitive values sealed to it where they are
    (``None``: it may), given its arguments and the values opened: a remote agent takes
    them only in the fields its operator lists."""

    async def invoke(self, raw_args: Mapping[str, Any]) -> Any:
        """Validate ``raw_args`` and run the handler; ``ValidationError`` on bad arguments."""
        args = self.args_model.model_validate(raw_args)
        return await self.handler(args)


@dataclass
class InProcessWorkerRuntime:
    """A ``WorkerRuntime`` that calls capabilities in this process (tests, single binary)."""

    capabilities: Mapping[str, Capability[Any]]
    calls: list[tuple[str, str]] = field(default_factory=list)

    async def execute(
        self, capability: str, args: Mapping[str, Any], *, call_id: str, retry: bool = True
    ) -> WorkerCallResult:
        self.calls.append((capability, call_id))
        started = time.perf_counter()
        target = self.capabilities.get(capability)
        try:
            if target is None:
                raise LookupError(f"no worker serves capability {capability!r}")
            result = await target.invoke(args)
        except ValidationError as exc:
            message = f"invalid arguments: {describe_validation_error(exc, '(arguments)')}"
        except Exception as exc:
            message = f"{type(exc).__name__}: {exc}"
        else:
            elapsed = timedelta(seconds=time.perf_counter() - started)
            attempt = ToolAttempt(attempt=1, outcome="ok", duration=elapsed, worker="in-process")
            return WorkerCallResult(result=result, attempts=(attempt,))
        elapsed = timedelta(seconds=time.perf_counter() - started)
        attempt = ToolAttempt(attempt=1, outcome="error", duration=elapsed, error=message)
        return WorkerCallResult(error=message, attempts=(attempt,))


@dataclass(frozen=True)
class ToolOutcome:
    """A finished tool call: the record for the trail and the observation for the model."""

    record: ToolCallRecord
    observation: ToolResultMessage


def _remote_task(binding: A2aBinding, reply: Any) -> tuple[A2aCallRef, Any]:
    """A remote A2A agent's reply split into what the record names (agent, card, task)
    and the result (the task's artifacts); a failed call names the agent only."""
    if not isinstance(reply, dict) or not isinstance(reply.get("a2a"), dict):
        return A2aCallRef(agent=binding.agent, skill=binding.skill), None
    return (A2aCallRef.model_validate({**reply["a2a"], "agent": binding.agent,
                                       "skill": binding.skill}),
            reply.get("artifacts"))


def without_bytes(result: Any) -> Any:
    """An MCP result's blocks (service/mcp/content.py) with each binary's bytes replaced by
    a line naming them, for a reader of text (the model cannot read base64; the report
    names the bytes by their digest): the record keeps the bytes."""
    if not isinstance(result, list):
        return result
    return [{**block, "data": f"[{block.get('bytes', 0):,} bytes of "
                              f"{block.get('mimeType') or 'binary'}, sha256 "
                              f"{block.get('sha256', '?')}: kept on the record, not shown]"}
            if isinstance(block, dict) and "data" in block else block for block in result]


class ToolBox:
    """The tools one agent offers, and the dispatch that runs a model's tool call."""

    def __init__(self, tools: Sequence[ToolSource], runtime: WorkerRuntime,
                 observer: Observer = NO_OBSERVER,
                 catalogs: Sequence[McpCatalogRead] = ()) -> None:
        self._tools: dict[str, ToolSource] = {tool.name: tool for tool in tools}
        self.catalogs = tuple(catalogs)
        """The MCP catalogs the tools were resolved against, for ``CASE_STARTED``."""
        self._runtime = runtime
        self._observer = observer
        self._specs = [_spec_of(tool) for tool in tools]

    @property
    def specs(self) -> list[ToolSpec]:
        """What the model is offered; built once (schema generation is not cheap)."""
        return self._specs

    @property
    def offers(self) -> list[tuple[str, str, str, str]]:
        """``(name, source, description, input schema digest)`` of every tool, for
        ``CASE_STARTED``: the digest is SHA-256 of the argument schema's canonical JSON."""
        return [(t.name, source_label(t), t.description, t.schema_digest)
                for t in self._tools.values()]

    async def run_all(self, calls: Sequence[ToolCallRequest], key: str) -> list[ToolOutcome]:
        """Run a turn's calls concurrently; outcomes keep the model's order.

        ``key`` names the case and cycle; each call's idempotency key is
        ``<key>:<its index in the turn>``, the same when the cycle runs again on a
        later attempt (the model's call ids may differ from one asking to the next).
        """
        if len(calls) == 1:
            return [await self.run(calls[0], f"{key}:0")]
        return list(await asyncio.gather(*(self.run(c, f"{key}:{i}")
                                           for i, c in enumerate(calls))))

    async def run(self, call: ToolCallRequest, key: str) -> ToolOutcome:
        started = time.perf_counter()
        tool = self._tools.get(call.name)
        source: str = "local" if tool is None else source_label(tool)
        # A model may name any tool: only the agent's own are labelled by name.
        label = call.name if tool is not None else "(unknown)"
        watch = self._observer.tool(
            label, call.id, source,
            call.arguments if call.arguments is not None else call.raw_arguments)
        attempts: tuple[ToolAttempt, ...] = ()
        if tool is None:
            known = ", ".join(sorted(self._tools)) or "none"
            error: str | None = f"unknown tool {call.name!r}; the tools are: {known}"
            result: Any = None
        elif call.arguments is None:
            error = (
                f"arguments for {call.name!r} are not a JSON object: {call.raw_arguments!r}"
            )
            result = None
        else:
            with watch.current():
                result, error, attempts = await self._dispatch(tool, call, key)
        remote = None
        if isinstance(tool, WorkerTool) and tool.a2a is not None:
            remote, result = _remote_task(tool.a2a, result)
        elapsed = time.perf_counter() - started
        watch.done(error, result, elapsed)
        duration = timedelta(seconds=elapsed)
        record = ToolCallRecord(
            tool_name=call.name,
            tool_args=call.arguments or {},
            tool_result=None if error else result,
            tool_source="worker" if source == "worker" else "local",
            duration=duration,
            tool_call_id=call.id,
            error=error,
            raw_args=call.raw_arguments if call.arguments is None else None,
            attempts=attempts,
            mcp=None if not isinstance(tool, WorkerTool) or tool.mcp is None else McpCallRef(
                server=tool.mcp.server, tool=tool.mcp.tool,
                schema_digest=tool.schema_digest),
            a2a=remote,
        )
        content = f"ERROR: {error}" if error else orjson.dumps(
            without_bytes(result) if record.mcp is not None else result).decode()
        observation = ToolResultMessage(call.id, call.name, content, is_error=error is not None)
        return ToolOutcome(record, observation)

    async def _dispatch(
        self, tool: ToolSource, call: ToolCallRequest, call_key: str
    ) -> tuple[Any, str | None, tuple[ToolAttempt, ...]]:
        arguments = call.arguments or {}
        if isinstance(tool, WorkerTool) and tool.mcp is not None:
            return await self._call_mcp(tool, tool.mcp, arguments, call_key)
        assert tool.args_model is not None
        try:
            args = tool.args_model.model_validate(arguments)
        except ValidationError as exc:
            reason = describe_validation_error(exc, "(arguments)")
            return None, f"invalid arguments for {tool.name!r}: {reason}", ()
        match tool:
            case LocalTool():
                try:
                    if inspect.iscoroutinefunction(tool.fn):
                        value = await tool.fn(args)
                    else:
                        value = await asyncio.to_thread(tool.fn, args)
                    # Results cross the bus as JSON: refuse what JSON cannot carry now,
                    # as a tool error, rather than failing later at publish time.
                    return orjson.loads(orjson.dumps(value)), None, ()
                except Exception as exc:
                    return None, f"{tool.name} failed: {type(exc).__name__}: {exc}", ()
            case WorkerTool():
                dumped = args.model_dump(mode="json", by_alias=True)
                if tool.a2a is not None:  # every retry sends the same messageId
                    dumped = {"skill": tool.a2a.skill, "arguments": dumped,
                              "text": tool.a2a.text, "messageId": call_key}
                outcome = await self._runtime.execute(tool.capability, dumped, call_id=call_key)
                return outcome.result, outcome.error, outcome.attempts
            case _:
                assert_never(tool)

    async def _call_mcp(
        self, tool: WorkerTool, mcp: McpBinding, arguments: dict[str, Any], call_key: str
    ) -> tuple[Any, str | None, tuple[ToolAttempt, ...]]:
        """An MCP server's tool: arguments checked against the schema offered (a JSON
        Schema validator, before anything is sent), then one request to its capability,
        retried only when the server says the tool is read-only or idempotent."""
        if mcp.unavailable is not None:
            return None, mcp.unavailable, ()
        if mcp.input_schema is not None and mcp.schema_digest is not None:
            problem = json_schema_problem(mcp.input_schema, mcp.schema_digest, arguments)
            if problem is not None:
                return None, f"invalid arguments for {tool.name!r}: {problem}", ()
        outcome = await self._runtime.execute(
            tool.capability, {"op": "call", "tool": mcp.tool, "arguments": arguments,
                              "schemaDigest": tool.schema_digest, "idempotencyKey": call_key},
            call_id=call_key, retry=mcp.retryable)
        return outcome.result, outcome.error, outcome.attempts
