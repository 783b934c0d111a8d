"""A "document digest" agent whose one tool returns as much text as it is asked for
(a capability on the bus, and the same as a local tool): the event size budget's tests
(tests/integration/test_tool_budget.py). Declared through the public ``casetrail`` API only."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from casetrail import (
    FINAL_ANSWER,
    Agent,
    AssistantTurn,
    ChatMessage,
    Limits,
    LocalTool,
    McpTool,
    WorkerTool,
    call,
    capability,
    case_input,
    observed,
)


class Camel(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True,
                              alias_generator=lambda name: "".join(
                                  w.capitalize() if i else w
                                  for i, w in enumerate(name.split("_"))))


class DigestRequest(Camel):
    document_bytes: int = Field(ge=1, le=4_000_000)
    source: Literal["capability", "local", "mcp"] = "capability"


class DocumentArgs(Camel):
    document_bytes: int = Field(ge=1, le=4_000_000)


class Digest(Camel):
    received_bytes: int = Field(ge=0)
    """What the model saw of the document (0 when it saw a shortened observation)."""
    shortened: bool = False
    tool_error: str | None = None


def _document(size: int) -> dict[str, Any]:
    line = "The quick brown fox jumps over the lazy dog. 0123456789\n"
    return {"text": (line * (size // len(line) + 1))[:size]}


@capability("bulky-document")
async def bulky_document(args: DocumentArgs) -> dict[str, Any]:
    """A document of the size asked for, from a remote archive."""
    return _document(args.document_bytes)


def local_document(args: DocumentArgs) -> dict[str, Any]:
    """A document of the size asked for, from this process."""
    return _document(args.document_bytes)


def digest(messages: Sequence[ChatMessage]) -> AssistantTurn:
    """The scripted brain: fetch the document, then say how much of it came back."""
    request, seen = case_input(messages), observed(messages)
    source = request.get("source", "capability")
    tool = TOOLS[source]
    if tool not in seen:
        size = request["documentBytes"]
        return AssistantTurn(text="I will fetch the document.", tool_calls=(
            call(tool, "fetch-1", **({"document_bytes": size} if source == "mcp"
                                     else {"documentBytes": size})),))
    got = seen[tool]
    if isinstance(got, Exception):
        return AssistantTurn(text="The document could not be recorded.", tool_calls=(
            call(FINAL_ANSWER, "final", receivedBytes=0, toolError=str(got)),))
    if isinstance(got, str) or "text" not in got:  # shortened to fit the context budget
        return AssistantTurn(text="The document is too long to read whole.", tool_calls=(
            call(FINAL_ANSWER, "final", receivedBytes=0, shortened=True),))
    return AssistantTurn(text="The document came back whole.", tool_calls=(
        call(FINAL_ANSWER, "final", receivedBytes=len(got["text"])),))


TOOLS = {"capability": "bulky-document", "local": "local-document",
         "mcp": "archive_document"}

BULKY = Agent(
    name="document-digest",
    version="1.0.0",
    description="Fetches a document and says how much of it came back.",
    instructions="Fetch the document, then report its size.",
    input=DigestRequest,
    answer=Digest,
    tools=[WorkerTool("bulky-document", args=DocumentArgs,
                      description="A document from the archive."),
           LocalTool(local_document), McpTool("archive", "document")],
    limits=Limits(max_cycles=4, deadline_seconds=60),
    script=digest,
    capabilities=[bulky_document],
)
