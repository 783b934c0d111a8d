"""``/docs``: Swagger UI over the API's OpenAPI document, served from this package.

FastAPI's own ``/docs`` and ``/redoc`` load their scripts from a CDN, with no integrity
check and no Content-Security-Policy: whoever controls that CDN (or the path to it)
runs code in the page of everyone who opens the docs, where an API key may be typed.
Here the Swagger UI files come from the ``swagger-ui-bundle-v2`` package, the page
starts it from a script file of ours (no inline script), and the CSP allows this
origin only. ReDoc is not served.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

from fastapi import FastAPI, HTTPException, Response
from swagger_ui_bundle import swagger_ui_path

from casetrail.contract.auth import Principal

_ASSETS = {"swagger-ui.css": "text/css", "swagger-ui-bundle.js": "text/javascript",
           "favicon-32x32.png": "image/png"}
_HEADERS = {
    # Swagger UI sets style attributes; no script but this origin's.
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self' "
                               "'unsafe-inline'; connect-src 'self'; img-src 'self' data:; "
                               "base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
_PAGE = b"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>casetrail API</title>
<link rel="icon" href="/docs/assets/favicon-32x32.png">
<link rel="stylesheet" href="/docs/assets/swagger-ui.css">
</head>
<body>
<div id="swagger-ui"></div>
<script src="/docs/assets/swagger-ui-bundle.js"></script>
<script src="/docs/assets/start.js"></script>
</body>
</html>
"""


def api_docs_routes(app: FastAPI, public: Any) -> None:
    """Add ``/docs`` and its assets to ``app`` (create it with ``docs_url=None`` and
    ``redoc_url=None``)."""
    assets = {name: (swagger_ui_path / name).read_bytes() for name in _ASSETS}
    assets["start.js"] = resources.files("casetrail.api").joinpath("apidocs.js").read_bytes()
    types = {**_ASSETS, "start.js": "text/javascript"}

    @app.get("/docs", include_in_schema=False)
    async def api_docs(_: Principal = public) -> Response:
        return Response(_PAGE, media_type="text/html; charset=utf-8", headers=_HEADERS)

    @app.get("/docs/assets/{name}", include_in_schema=False)
    async def api_docs_asset(name: str, _: Principal = public) -> Response:
        if name not in assets:
            raise HTTPException(404, f"no asset {name}")
        return Response(assets[name], media_type=types[name],
                        headers={**_HEADERS, "Cache-Control": "public, max-age=86400"})
