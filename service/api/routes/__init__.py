"""The API's routes, by what they serve: cases, streams, the log, meta, the viewer."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from fastapi.routing import APIRoute
from starlette.routing import BaseRoute


def api_routes(routes: Iterable[BaseRoute]) -> Iterator[APIRoute]:
    """Every API route of ``routes`` (an app's), those of included routers too."""
    for route in routes:
        if isinstance(route, APIRoute):
            yield route
        elif (included := getattr(route, "original_router", None)) is not None:
            yield from api_routes(included.routes)
