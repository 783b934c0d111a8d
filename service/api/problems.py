"""Every error the API answers, as RFC 9457 problem details
(``application/problem+json``): one table maps each kind of refusal to its status,
and the OpenAPI document's error responses are built from the same table.

A 422 adds ``errors``: each invalid field as ``{"loc", "msg", "type"}``, where
``loc`` starts with where it was (``body``, ``query``, ``header``, ``path``)."""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

import orjson
from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from casetrail.api.routes import api_routes
from casetrail.api.schemas import Problem, ValidationProblem
from casetrail.cases.errors import (
    CaseProblem,
    Conflict,
    Expired,
    Forbidden,
    Invalid,
    NotAccepted,
    NotFound,
    NotInstalled,
    NotYet,
    OverQuota,
)
from casetrail.errors import BusUnavailable, StoreUnavailable

MEDIA_TYPE = "application/problem+json"
RETRY_LATER = {"Retry-After": "5"}

STATUS_OF: dict[type[Exception], int] = {
    Expired: 410, NotFound: 404, Conflict: 409, Forbidden: 403, Invalid: 422, OverQuota: 429,
    NotAccepted: 503, StoreUnavailable: 503, BusUnavailable: 503, NotInstalled: 501,
}
"""The status of each refusal (a subclass answers as its nearest listed base)."""

DESCRIBED: dict[int, tuple[type, str]] = {
    400: (Problem, "The body is not readable JSON"),
    401: (Problem, "No valid API key: a WWW-Authenticate: Bearer challenge"),
    403: (Problem, "The API key lacks a scope this route needs (named)"),
    404: (Problem, "No such case (or not the caller's)"),
    409: (Problem, "Conflicts with the case's state or an earlier request"),
    410: (Problem, "The case expired under its retention policy: only its CASE_EXPIRED "
                   "and tombstone remain (GET /cases/{id}/verify checks them)"),
    413: (Problem, "The body is larger than CASETRAIL_MAX_BODY_BYTES"),
    422: (ValidationProblem, "A field is invalid: each one with the reason"),
    429: (Problem, "A limit is reached; Retry-After says when to try again"),
    501: (Problem, "This deployment lacks the optional part of casetrail the route needs "
                   "(named, with what to install)"),
    503: (Problem, "Broker or database unavailable; nothing was kept"),
}
"""What each error status means on this API (the OpenAPI responses)."""


def responses(ok: int, model: type, description: str, *errors: int
              ) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI responses of a route: its success and every error it can answer."""
    return {ok: {"model": model, "description": description}, **error_responses(*errors)}


def error_responses(*errors: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI responses of the errors a route can answer."""
    described: dict[int | str, dict[str, Any]] = {}
    for code in errors:
        error_model, error_description = DESCRIBED[code]
        described[code] = {"model": error_model, "description": error_description}
    return described


def problem(status: int, detail: str, *, errors: list[dict[str, Any]] | None = None,
            headers: dict[str, str] | None = None) -> Response:
    body: dict[str, Any] = {"type": "about:blank", "title": HTTPStatus(status).phrase,
                            "status": status, "detail": detail}
    if errors is not None:
        body["errors"] = errors
    return Response(orjson.dumps(body), status_code=status, headers=headers,
                    media_type=MEDIA_TYPE)


def _issues(problems: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"loc": list(p.get("loc", ())), "msg": str(p.get("msg", "")),
             "type": str(p.get("type", "value_error"))} for p in problems]


def _detail_of(issues: list[dict[str, Any]]) -> str:
    return "; ".join(f"{'.'.join(map(str, i['loc']))}: {i['msg']}" for i in issues)


def install(app: FastAPI) -> None:
    """Answer every refusal of ``app`` as a problem."""

    @app.exception_handler(CaseProblem)
    async def refused(request: Request, exc: CaseProblem) -> Response:
        status = next(code for kind, code in STATUS_OF.items() if isinstance(exc, kind))
        if isinstance(exc, Invalid):
            issues = [{"loc": list(i.loc), "msg": i.msg, "type": "value_error"}
                      for i in exc.issues]
            return problem(422, exc.detail, errors=issues)
        headers = {"Retry-After": str(exc.retry_after)} \
            if isinstance(exc, OverQuota | NotYet) else RETRY_LATER if status == 503 else None
        return problem(status, exc.detail, headers=headers)

    @app.exception_handler(StoreUnavailable)
    async def store_down(request: Request, exc: StoreUnavailable) -> Response:
        return problem(503, "database unavailable, try again", headers=RETRY_LATER)

    @app.exception_handler(BusUnavailable)
    async def bus_down(request: Request, exc: BusUnavailable) -> Response:
        return problem(503, "message broker unavailable, try again", headers=RETRY_LATER)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> Response:
        issues = _issues(list(exc.errors()))
        return problem(422, _detail_of(issues), errors=issues)

    @app.exception_handler(StarletteHTTPException)
    async def http_problem(request: Request, exc: StarletteHTTPException) -> Response:
        """Starlette's and the routes' own refusals; a 405's ``Allow`` names every method
        the path has (Starlette names only those of the first route it matched)."""
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            methods = {m for route in api_routes(app.routes)
                       if route.path_regex.match(request.url.path) for m in route.methods or ()}
            headers["Allow"] = ", ".join(sorted(methods))
        if isinstance(exc.detail, list):
            issues = _issues(exc.detail)
            return problem(exc.status_code, _detail_of(issues), errors=issues, headers=headers)
        return problem(exc.status_code, str(exc.detail), headers=headers or None)


def problem_media_types(document: dict[str, Any]) -> None:
    """In the OpenAPI document, every problem answer as ``application/problem+json``
    (FastAPI labels each response with the route's own media type)."""
    problems = {f"#/components/schemas/{m.__name__}" for m in (Problem, ValidationProblem)}
    for operations in document["paths"].values():
        for operation in operations.values():
            for response in operation.get("responses", {}).values():
                content = response.get("content", {})
                for media in list(content):
                    if content[media].get("schema", {}).get("$ref") in problems:
                        content[MEDIA_TYPE] = content.pop(media)
