"""An "exhibit reader" agent whose one tool, an MCP server's, returns every MCP content
type (tests/integration/test_mcp_content.py). Declared through the public ``casetrail``
API only."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict

from casetrail import (
    FINAL_ANSWER,
    Agent,
    AssistantTurn,
    ChatMessage,
    Limits,
    McpTool,
    call,
    observed,
)

TOOL = "archive_exhibit"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ExhibitRequest(Strict):
    number: int


class Reading(Strict):
    blocks: int
    """How many blocks the tool's result had, as the model saw it."""
    saw_bytes: bool
    """Whether any base64 reached the model (it should not)."""


def read_the_exhibit(messages: Sequence[ChatMessage]) -> AssistantTurn:
    seen = observed(messages)
    if TOOL not in seen:
        return AssistantTurn(text="I will fetch the exhibit.", tool_calls=(
            call(TOOL, "exhibit-1", number=7),))
    got = seen[TOOL]
    blocks = got if isinstance(got, list) else []
    raw = any(isinstance(b, dict) and str(b.get("data", "")).startswith(("iVBOR", "UklGR"))
              for b in blocks)
    return AssistantTurn(text=f"The exhibit has {len(blocks)} parts.", tool_calls=(
        call(FINAL_ANSWER, "final", blocks=len(blocks), saw_bytes=raw),))


EXHIBITS = Agent(
    name="exhibit-reader", version="1.0.0", description="Reads an exhibit from the archive.",
    instructions="Fetch the exhibit, then say how many parts it has.", input=ExhibitRequest,
    answer=Reading, tools=[McpTool("archive", "exhibit")],
    limits=Limits(max_cycles=3, deadline_seconds=60), script=read_the_exhibit,
)
