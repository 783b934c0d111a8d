"""A "world clock" agent whose one tool is served by an official reference MCP server
(``mcp-server-time`` from PyPI, installed into the project's own environment): the MCP
interoperability test (tests/integration/test_mcp_reference.py). Declared through the
public ``casetrail`` API only."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from casetrail import (
    FINAL_ANSWER,
    Agent,
    AssistantTurn,
    ChatMessage,
    Limits,
    McpTool,
    call,
    case_input,
    observed,
)

TOOL = "time_get_current_time"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ClockRequest(Strict):
    timezone: str = Field(min_length=1, max_length=64, description="An IANA time zone.")


class ClockReading(Strict):
    timezone: str
    datetime: str = Field(description="The time there, as the server said it.")
    error: str | None = None


def read_the_clock(messages: Sequence[ChatMessage]) -> AssistantTurn:
    """The scripted brain: ask the server for the time in the zone, then report it."""
    zone, seen = case_input(messages)["timezone"], observed(messages)
    if TOOL not in seen:
        return AssistantTurn(text=f"I will ask for the time in {zone}.", tool_calls=(
            call(TOOL, "clock-1", timezone=zone),))
    got = seen[TOOL]
    if isinstance(got, Exception) or not isinstance(got, dict):
        return AssistantTurn(text="The clock did not answer.", tool_calls=(
            call(FINAL_ANSWER, "final", timezone=zone, datetime="", error=str(got)),))
    return AssistantTurn(text=f"It is {got['datetime']} in {zone}.", tool_calls=(
        call(FINAL_ANSWER, "final", timezone=got["timezone"], datetime=got["datetime"]),))


CLOCK = Agent(
    name="world-clock",
    version="1.0.0",
    description="Says what time it is in a time zone, as a reference MCP server reads it.",
    instructions="Ask the time server for the current time in the zone, then report it.",
    input=ClockRequest,
    answer=ClockReading,
    tools=[McpTool("time", "get_current_time")],
    limits=Limits(max_cycles=3, deadline_seconds=60),
    script=read_the_clock,
)


def _misconfigured(name: str, server: str, tool: str) -> Agent:
    return Agent(name=name, version="1.0.0", description="A clock configured wrongly.",
                 instructions="Ask the time server.", input=ClockRequest, answer=ClockReading,
                 tools=[McpTool(server, tool)], limits=Limits(max_cycles=3, deadline_seconds=60),
                 script=read_the_clock)


UNSERVED = _misconfigured("weather-clock", "weather", "forecast")
"""Names an MCP server no deployment here configures."""
MISSPELT = _misconfigured("misspelt-clock", "time", "get_time")
"""Names a tool the time server does not serve."""
