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
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Generic, Protocol, TypeAlias, TypeVar, assert_never, cast

import orjson
from pydantic import BaseModel, ValidationError

from service.engine.chat import ToolCallRequest, ToolResultMessage, ToolSpec
from service.events import ToolAttempt, ToolCallRecord, describe_validation_error
from service.integrity import canonical
from service.telemetry import genai, metrics, tracing

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


@dataclass(frozen=True)
class WorkerTool:
    """A tool executed by a capability worker through a ``WorkerRuntime``."""

    name: str
    description: str
    capability: str
    args_model: type[BaseModel]

    @property
    def spec(self) -> ToolSpec:
        return ToolSpec(self.name, self.description, _schema(self.args_model))


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

    ``call_id`` is the idempotency key shared by every attempt of one call.
    Never raises for a tool failure: the failure is in the result.
    """

    async def execute(
        self, capability: str, args: Mapping[str, Any], *, call_id: str
    ) -> WorkerCallResult: ...


@dataclass(frozen=True)
class Capability(Generic[ArgsT]):
    """What a capability worker serves: a name, an argument model, an async handler."""

    name: str
    args_model: type[ArgsT]
    handler: Callable[[ArgsT], Awaitable[Any]]

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
        self, capability: str, args: Mapping[str, Any], *, call_id: str
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


class ToolBox:
    """The tools one agent offers, and the dispatch that runs a model's tool call."""

    def __init__(self, tools: Sequence[ToolSource], runtime: WorkerRuntime) -> None:
        self._tools: dict[str, ToolSource] = {tool.name: tool for tool in tools}
        self._runtime = runtime
        self._specs = [_spec_of(tool) for tool in tools]

    @property
    def specs(self) -> list[ToolSpec]:
        """What the model is offered; built once (schema generation is not cheap)."""
        return self._specs

    @property
    def offers(self) -> list[tuple[str, str, str, str]]:
        """``(name, source, description, input schema digest)`` of every tool, for
        ``CASE_STARTED``: the digest is SHA-256 of the argument schema's canonical JSON."""
        return [(t.name, source_label(t), t.description,
                 _schema_digest(cast("type[BaseModel]", t.args_model)))
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
        span = None if not tracing.ENABLED else genai.tool_span(
            label, call.id, "extension" if source == "worker" else "function",
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
            with tracing.current(span):
                result, error, attempts = await self._dispatch(tool, call, key)
        elapsed = time.perf_counter() - started
        metrics.tool_call(label, source, error is None).observe(elapsed)
        if span is not None:
            genai.tool_done(span, error, result)
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
        )
        content = f"ERROR: {error}" if error else orjson.dumps(result).decode()
        observation = ToolResultMessage(call.id, call.name, content, is_error=error is not None)
        return ToolOutcome(record, observation)

    async def _dispatch(
        self, tool: ToolSource, call: ToolCallRequest, call_key: str
    ) -> tuple[Any, str | None, tuple[ToolAttempt, ...]]:
        arguments = call.arguments or {}
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
                outcome = await self._runtime.execute(
                    tool.capability, args.model_dump(mode="json", by_alias=True), call_id=call_key
                )
                return outcome.result, outcome.error, outcome.attempts
            case _:
                assert_never(tool)
