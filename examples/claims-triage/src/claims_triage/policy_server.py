"""The insurer's policy records as an MCP server (stdio by default; ``--http PORT`` for
Streamable HTTP), written with the MCP SDK alone: casetrail's capability worker runs it
and offers its tools to the agents that name them."""

from __future__ import annotations

import argparse
import os
from typing import Any

import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

server = MCPServer("policies")

_POLICIES: dict[str, dict[str, Any]] = {
    "POL-100001": {"holder": "Ada Lovelace", "active": True, "coverageLimit": 20_000,
                   "deductible": 500, "excluded": ["flood"]},
    "POL-100002": {"holder": "Ada Lovelace", "active": True, "coverageLimit": 5_000,
                   "deductible": 250, "excluded": []},
    "POL-100003": {"holder": "Grace Hopper", "active": False, "coverageLimit": 10_000,
                   "deductible": 500, "excluded": []},
}


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def coverage(policy_number: str, claimant_name: str) -> dict[str, Any]:
    """The policy's coverage: whether the claimant holds it, whether it is active, its
    limit, its deductible and what it excludes."""
    found = _POLICIES.get(policy_number)
    if found is None:
        raise ToolError(f"no policy {policy_number}")  # the model reads this message
    terms = {k: v for k, v in found.items() if k != "holder"}
    return {"policyNumber": policy_number, "holderMatches": claimant_name == found["holder"],
            **terms}


@server.tool()
def open_investigation(claim_id: str, reason: str) -> dict[str, Any]:
    """Open a fraud investigation for a claim (not read-only, not idempotent: casetrail
    sends it at most once)."""
    return {"claimId": claim_id, "investigation": f"INV-{claim_id[-5:]}", "reason": reason}


def _bearer_only(app: ASGIApp, token: str) -> ASGIApp:
    """``app`` answering only requests that carry ``Authorization: Bearer <token>``."""
    expected = f"Bearer {token}".encode()

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != expected:
            await PlainTextResponse("unauthorized", status_code=401)(scope, receive, send)
            return
        await app(scope, receive, send)

    return guarded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--http", type=int, metavar="PORT",
                        help="serve Streamable HTTP on 127.0.0.1:PORT/mcp instead of stdio")
    parser.add_argument("--token-env", metavar="NAME",
                        help="with --http: answer only requests bearing the token in $NAME")
    options = parser.parse_args()
    if not options.http:
        server.run()
        return
    app = server.streamable_http_app()
    if options.token_env:
        app = _bearer_only(app, os.environ[options.token_env])
    uvicorn.run(app, host="127.0.0.1", port=options.http, log_level="warning")


if __name__ == "__main__":
    main()
