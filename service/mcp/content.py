"""An MCP tool's result as the record keeps it (docs/agents.md, "MCP tools"): the
server's ``structuredContent`` when it gives one; its text when every block is text;
otherwise every block, none of them lost — text; an embedded text resource inline
(its URI, media type and text); binary content (an image, audio, an embedded blob) as
its media type, size and SHA-256 with the bytes kept (base64, addressed by the digest,
within the event's tool-result budget); a resource link as its URI, name and media
type. The model is shown the same blocks with each binary's bytes replaced by a line
naming them (``without_bytes`` in service/engine/tools.py): the record keeps them."""

from __future__ import annotations

import base64
import binascii
import hashlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mcp.types import CallToolResult, ContentBlock


def recorded(result: CallToolResult) -> Any:
    """What the record keeps of a successful call's result."""
    if result.structured_content is not None:
        return result.structured_content
    texts = [getattr(block, "text", None) for block in result.content]
    if all(isinstance(text, str) for text in texts):
        return "\n".join(t for t in texts if isinstance(t, str))
    return [_block(block) for block in result.content]


def text_of(result: CallToolResult) -> str:
    """A failed call's blocks as one line of text for the error."""
    return "\n".join(getattr(block, "text", None) or f"[{block.type} content]"
                     for block in result.content)


def _binary(kind: str, media_type: str | None, data: str, **more: Any) -> dict[str, Any]:
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return {"type": kind, "mimeType": media_type, "invalid": "not base64", **more}
    return {"type": kind, "mimeType": media_type, "bytes": len(raw),
            "sha256": hashlib.sha256(raw).hexdigest(), "data": data, **more}


def _block(block: ContentBlock) -> dict[str, Any]:
    from mcp.types import (
        AudioContent,
        BlobResourceContents,
        EmbeddedResource,
        ImageContent,
        ResourceLink,
        TextContent,
    )

    match block:
        case TextContent():
            return {"type": "text", "text": block.text}
        case ImageContent() | AudioContent():
            return _binary(block.type, block.mime_type, block.data)
        case EmbeddedResource(resource=BlobResourceContents() as blob):
            return _binary("resource", blob.mime_type, blob.blob, uri=str(blob.uri))
        case EmbeddedResource(resource=resource):
            return {"type": "resource", "uri": str(resource.uri),
                    "mimeType": resource.mime_type, "text": getattr(resource, "text", "")}
        case ResourceLink():
            link: dict[str, Any] = {"type": "resource_link", "uri": str(block.uri),
                                    "name": block.name, "mimeType": block.mime_type}
            for key, value in (("title", block.title), ("description", block.description),
                               ("size", block.size)):
                if value is not None:
                    link[key] = value
            return link
    return {"type": getattr(block, "type", "unknown"),
            "unreadable": "a content type this casetrail does not know"}
