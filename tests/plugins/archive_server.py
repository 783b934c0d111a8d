"""A document archive as an MCP server over stdio (the MCP SDK alone): its one tool
returns a document of the size asked for (tests/integration/test_tool_budget.py)."""

from __future__ import annotations

from typing import Any

from mcp.server.fastmcp import FastMCP
from mcp.types import ToolAnnotations

server = FastMCP("archive")
LINE = "The quick brown fox jumps over the lazy dog. 0123456789\n"


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def document(document_bytes: int) -> dict[str, Any]:
    """A document of ``document_bytes`` characters from the archive."""
    return {"text": (LINE * (document_bytes // len(LINE) + 1))[:document_bytes]}


if __name__ == "__main__":
    server.run()
