"""The trail viewer: a static shell under ``/ui/`` whose data comes from the API.

The shell is public (it holds no data); the page asks for an API key, keeps it in the
tab's ``sessionStorage`` only, and sends it as ``Authorization: Bearer`` on every call,
streams included (read with ``fetch``, never an ``EventSource`` with a key in the URL).
There is no build step and nothing is fetched from elsewhere: the files in
``service/api/ui/`` are served as they are, read once at start.

The Content-Security-Policy allows scripts, styles and connections to this origin only,
and the page writes every value from a trail as text, never as markup, so a tool
result that holds HTML is shown, not run. Reasoning is Markdown, rendered by
markdown-it 14.3.3 (MIT, ``markdown-it.min.js`` as published on npm) with raw HTML off:
any HTML in it is escaped to text, links are limited to safe schemes, and the policy
still lets no image or script load from elsewhere.
"""

from __future__ import annotations

import uuid
from importlib import resources
from typing import Any

import orjson
from fastapi import FastAPI, HTTPException, Response

from casetrail.contract.auth import Principal
from casetrail.contract.events import (
    PARKING_EVENT_TYPE,
    RUNNING_EVENT_TYPES,
    TERMINAL_EVENT_TYPES,
    CaseStatus,
    status_for,
)

_ASSETS = {"app.js": "text/javascript", "backtests.js": "text/javascript",
           "style.css": "text/css",
           "markdown-it.min.js": "text/javascript",
           "favicon.svg": "image/svg+xml", "vocabulary.json": "application/json"}
_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                               "connect-src 'self'; img-src 'self' blob:; base-uri 'none'; "
                               "form-action 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def _read(name: str) -> bytes:
    return resources.files("casetrail.api").joinpath("ui", name).read_bytes()


def viewer_routes(app: FastAPI, public: Any) -> None:
    """Add ``/ui/``, ``/ui/reviews``, ``/ui/cases/{case_id}``, ``/ui/backtests``,
    ``/ui/backtests/{backtest_id}`` and the shell's assets to ``app``
    (``public``: the dependency that marks a route open to anyone)."""
    shell = _read("index.html")
    assets = {name: _read(name) for name in _ASSETS if name != "vocabulary.json"}
    # The contract's words for the page, from the definitions the code uses (not copied).
    assets["vocabulary.json"] = orjson.dumps({
        "statuses": list(CaseStatus), "terminalEventTypes": sorted(TERMINAL_EVENT_TYPES),
        # The status each event gives its case, as the consumer folds it.
        "statusOfEvent": {
            **{t: CaseStatus.RUNNING for t in RUNNING_EVENT_TYPES},
            PARKING_EVENT_TYPE: CaseStatus.AWAITING_REVIEW,
            **{t: status_for(t) for t in TERMINAL_EVENT_TYPES}}})

    def page() -> Response:
        return Response(shell, media_type="text/html; charset=utf-8", headers=_HEADERS)

    @app.get("/ui/", include_in_schema=False)
    async def viewer_list(_: Principal = public) -> Response:
        return page()

    @app.get("/ui/reviews", include_in_schema=False)
    async def viewer_reviews(_: Principal = public) -> Response:
        return page()

    @app.get("/ui/cases/{case_id}", include_in_schema=False)
    async def viewer_case(case_id: uuid.UUID, _: Principal = public) -> Response:
        return page()

    @app.get("/ui/backtests", include_in_schema=False)
    async def viewer_backtests(_: Principal = public) -> Response:
        return page()

    @app.get("/ui/backtests/{backtest_id}", include_in_schema=False)
    async def viewer_backtest(backtest_id: uuid.UUID, _: Principal = public) -> Response:
        return page()

    @app.get("/ui/assets/{name}", include_in_schema=False)
    async def viewer_asset(name: str, _: Principal = public) -> Response:
        if name not in assets:
            raise HTTPException(404, f"no asset {name}")
        return Response(assets[name], media_type=_ASSETS[name], headers=_HEADERS)
