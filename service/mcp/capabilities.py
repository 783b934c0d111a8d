"""The configured MCP servers as capabilities, for the registry.

A module of its own so that the package (its request types and catalog, which
``session.py`` imports) never imports ``session.py`` back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from casetrail.engine.tools import Capability


def mcp_capabilities(servers: Sequence[Any]) -> list[Capability[Any]]:
    """The capabilities of the configured MCP servers (``McpServer`` settings), for the
    registry; the SDK is loaded only by a capability worker that serves one."""
    from casetrail.mcp.session import serving

    return [serving(server) for server in servers]

