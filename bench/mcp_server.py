"""The benchmark's MCP server over stdio (the MCP SDK alone): one read-only tool
(bench/mcp_down.py offers it; the benchmark never calls it)."""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

server = MCPServer("bench")


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def document(name: str) -> dict[str, str]:
    """A document by name."""
    return {"name": name, "text": "nothing to see"}


if __name__ == "__main__":
    server.run()
