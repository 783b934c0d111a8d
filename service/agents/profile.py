"""Agent profiles: a named agent's prompt, tools, input schema, defaults and scripted brain."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, model_validator
from pydantic.alias_generators import to_camel

from casetrail.contract.events import Limits, ModelRef, refuse_boolean_numbers
from casetrail.contract.integrity import canonical
from casetrail.engine.answers import Answering, Check, Review
from casetrail.engine.chat import ChatMessage, ToolResultMessage, UserMessage
from casetrail.engine.scripted import ScriptFn
from casetrail.engine.tools import Capability, ToolSource, WorkerTool, source_label


class CamelModel(BaseModel):
    """Base for agent inputs and tool arguments: camelCase JSON, unknown keys refused."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _no_boolean_numbers(cls, data: Any) -> Any:
        return refuse_boolean_numbers(cls, data)


@dataclass(frozen=True)
class AgentProfile:
    """A named agent: what it is for, how it is prompted, which tools it may call."""

    name: str
    description: str
    system_prompt: str
    tools: tuple[ToolSource, ...]
    input_model: type[BaseModel]
    default_model: ModelRef
    default_limits: Limits
    script: ScriptFn | None
    """The scripted brain, for cases run on the scripted provider (none: a real model only)."""
    capabilities: tuple[Capability[Any], ...] = ()
    context_budget_tokens: int = 32_000
    bench_only: bool = False
    """Offered only with CASETRAIL_BENCH_MODE=1 (a load generator, not an agent)."""
    version: str = "1.0.0"
    """Bumped when the prompt, the tools or the policy change; recorded in CASE_STARTED."""
    answer_model: type[BaseModel] | None = None
    """The answer's schema: the model gives it through the final-answer tool, and a case
    completes only with an answer that validates (docs/design.md)."""
    checks: tuple[Check, ...] = ()
    """Named, versioned checks over the input, the tool calls and the answer."""
    keys: tuple[str, ...] = ()
    """Input fields (their JSON names) that identify a case to people: found by
    ``GET /cases?key=VALUE`` (a sensitive one through a keyed digest)."""
    review: Review | None = None
    """Which answers a person decides before the case ends (none: the agent's answer
    stands, unless the tenant reviews every case)."""
    asks_people: bool = False
    """The model is offered ``ask_a_person``: the case waits for a person's answer."""

    @functools.cached_property
    def digest(self) -> str:
        """``agentDigest`` (docs/design.md): what defines the agent, hashed; recorded in
        every ``CASE_STARTED``."""
        return hashlib.sha256(canonical({
            "name": self.name, "version": self.version, "instructions": self.system_prompt,
            "tools": [{"name": t.name, "description": t.description,
                       "parameters": t.spec.parameters, **_mcp_of(t)} for t in self.tools],
            "answer": None if self.answer_model is None
            else self.answer_model.model_json_schema(by_alias=True),
            "checks": [{"name": c.name, "version": c.version, "blocking": c.blocking}
                       for c in self.checks],
            **({} if self.review is None else {"review": self._review_json()}),
            **({"asksPeople": True} if self.asks_people else {})})).hexdigest()

    def _review_json(self) -> dict[str, Any]:
        assert self.review is not None
        return {"decisions": sorted(self.review.decisions), "field": self.review.field,
                "failedChecks": self.review.failed_checks}

    @property
    def answering(self) -> Answering | None:
        return None if self.answer_model is None else Answering(self.answer_model, self.checks,
                                                                self.review)

    def input_schema(self) -> dict[str, Any]:
        return self.input_model.model_json_schema(by_alias=True)

    def describe(self) -> dict[str, Any]:
        """The public description served by ``GET /agents``."""
        return {
            "name": self.name,
            "version": self.version,
            "description": self.description,
            "tools": [
                {"name": t.name, "source": source_label(t), "description": t.description,
                 **_mcp_of(t)}
                for t in self.tools
            ],
            "inputSchema": self.input_schema(),
            **({} if self.answer_model is None else {
                "answerSchema": self.answer_model.model_json_schema(by_alias=True)}),
            "checks": [{"name": c.name, "version": c.version, "blocking": c.blocking}
                       for c in self.checks],
            "keys": list(self.keys),
            **({} if self.review is None else {"review": self._review_json()}),
            **({"asksPeople": True} if self.asks_people else {}),
            "defaultModel": self.default_model.model_dump(by_alias=True, exclude_none=True),
            "defaultLimits": self.default_limits.model_dump(by_alias=True),
        }


def _mcp_of(tool: ToolSource) -> dict[str, Any]:
    """``{"mcp": {"server", "tool"}}`` for an MCP server's tool, else nothing."""
    if isinstance(tool, WorkerTool) and tool.mcp is not None:
        return {"mcp": {"server": tool.mcp.server, "tool": tool.mcp.tool}}
    return {}


def case_input(messages: Sequence[ChatMessage]) -> dict[str, Any]:
    """The case input as the engine gave it to the model in the first user message."""
    for message in messages:
        if isinstance(message, UserMessage) and message.text.startswith("Case input:"):
            value = orjson.loads(message.text.split("\n", 1)[1])
            assert isinstance(value, dict)
            return value
    raise ValueError("no case input in the conversation")


def observed(messages: Sequence[ChatMessage]) -> dict[str, Any]:
    """Tool results seen so far, by tool name: the parsed JSON, an ``Exception`` for
    errors, or the text itself when it is not JSON (an observation shortened to fit the
    context budget keeps its first characters and says how many it hides). A result that
    is text holding a JSON object or array (an MCP server that answers JSON as its text
    content) is parsed too; the record keeps the text as the server returned it."""
    seen: dict[str, Any] = {}
    for message in messages:
        if isinstance(message, ToolResultMessage):
            if message.is_error:
                seen[message.tool_name] = RuntimeError(message.content.removeprefix("ERROR: "))
            else:
                seen[message.tool_name] = _parsed(message.content)
    return seen


def _parsed(content: str) -> Any:
    """An observation's content as the scripted brain reads it: its JSON parsed, and a
    string in it that holds a JSON object or array parsed again; else the text."""
    try:
        value = orjson.loads(content)
    except orjson.JSONDecodeError:
        return content
    if isinstance(value, str) and value.lstrip()[:1] in ("{", "["):
        try:
            inner = orjson.loads(value)
        except orjson.JSONDecodeError:
            return value
        return inner if isinstance(inner, dict | list) else value
    return value


def errors_in(seen: dict[str, Any]) -> list[str]:
    return [f"{name}: {value}" for name, value in seen.items() if isinstance(value, Exception)]
