"""A document archive as an MCP server over stdio (the MCP SDK alone): ``document``
returns a document of the size asked for (tests/integration/test_tool_budget.py);
``exhibit`` returns one block of every MCP content type
(tests/integration/test_mcp_content.py)."""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.types import (
    AudioContent,
    BlobResourceContents,
    CallToolResult,
    EmbeddedResource,
    ImageContent,
    ResourceLink,
    TextContent,
    TextResourceContents,
    ToolAnnotations,
)

server = MCPServer("archive")
LINE = "The quick brown fox jumps over the lazy dog. 0123456789\n"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def document(document_bytes: int) -> dict[str, Any]:
    """A document of ``document_bytes`` characters from the archive."""
    return {"text": (LINE * (document_bytes // len(LINE) + 1))[:document_bytes]}


PIXEL = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJ"
         "RU5ErkJggg==")
"""A 1x1 PNG, base64."""
CHIRP = "UklGRiQAAABXQVZFZm10IBAAAAABAAEAQB8AAIA+AAACABAAZGF0YQAAAAA="
"""An empty WAV, base64."""


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def exhibit(number: int) -> CallToolResult:
    """Exhibit ``number``: a caption, a photograph, a transcript, a recording, the signed
    original and where the full file lives."""
    return CallToolResult(content=[
        TextContent(text=f"Exhibit {number}: the damaged kitchen."),
        ImageContent(data=PIXEL, mime_type="image/png"),
        EmbeddedResource(resource=TextResourceContents(
            uri=f"archive://exhibits/{number}/transcript", mime_type="text/plain",
            text="Claimant: the fire started at the stove.")),
        AudioContent(data=CHIRP, mime_type="audio/wav"),
        EmbeddedResource(resource=BlobResourceContents(
            uri=f"archive://exhibits/{number}/original", mime_type="application/pdf",
            blob="JVBERi0xLjQK")),
        ResourceLink(uri=f"https://archive.example/exhibits/{number}.tiff", name="full scan",
                     mime_type="image/tiff", description="600 dpi"),
    ])


if __name__ == "__main__":
    server.run()
