"""How the API answers what goes wrong: one JSON shape (``{"detail", "errors"?}``) for
every error, the statuses each operation documents, and the conversion of frontier and
Redis exceptions at the API boundary (:func:`install`).

* invalid input: 422 with one ``{loc, msg}`` per bad field (:class:`Invalid`, FastAPI's
  validation errors);
* Redis unreachable, or refusing because of the server's state (OOM, READONLY,
  LOADING...): 503, retry later;
* anything a crawl's stored state makes the frontier raise (a counter that is not a
  number, a corrupt record or lease, a bad layout, a key of the wrong type):
  :class:`Unreadable`, 500 naming the crawl; other crawls are not affected.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

import redis
import redis.exceptions
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from redcrawl.api import models as m
from redcrawl.api.inputs import UNION_TAGS
from redcrawl.api.limits import BodyTooLarge
from redcrawl.connection import redact
from redcrawl.errors import ConfigError, ConnectionError_, FrontierError
from redcrawl.keys import validate_crawl_name
from redcrawl.settings import Settings
from redcrawl.transport import CLUSTER_TRANSIENT, WORKER_ADVICE
from redcrawl.transport import TRANSIENT as REDIS_TRANSIENT

log = logging.getLogger("redcrawl.api")

__all__ = [
    "RESPONSES",
    "TRANSIENT",
    "Invalid",
    "ServerRefused",
    "StateErrors",
    "Unreadable",
    "clean",
    "error",
    "install",
    "responses",
    "server_condition",
]

SERVER_CONDITIONS = (
    "OOM",
    "READONLY",
    "LOADING",
    "MASTERDOWN",
    "BUSY",
    "NOREPLICAS",
    "CLUSTERDOWN",
    "TRYAGAIN",
    "NOAUTH",
    "NOPERM",
)
"""Redis error prefixes that describe the server's state (answered 503: retry later);
any other refusal of a frontier step comes from what a crawl's keys hold."""


clean = m.printable
"""``text`` safe to put in a JSON response (no lone surrogates)."""


def error(
    status_code: int,
    detail: str,
    errors: list[m.ErrorItem] | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    body = m.ErrorOut(detail=clean(detail), errors=errors)
    return JSONResponse(
        body.model_dump(exclude_none=True), status_code, headers=dict(headers) if headers else None
    )


class Unreadable(Exception):
    """The stored state of a crawl cannot be read (a key written by something else than
    redcrawl, or corrupt): answered with 500 and redcrawl's error shape."""

    def __init__(self, crawl: str | None, cause: BaseException) -> None:
        self.crawl, self.cause = crawl, cause
        name = f"crawl {crawl!r}" if crawl else "a crawl"
        super().__init__(
            f"the stored state of {name} cannot be read ({type(cause).__name__}: "
            f"{clean(str(cause))[:500]}): one of its keys was written by something else "
            "than redcrawl or is corrupt. Inspect its keys with redis-cli, or purge it "
            "(DELETE /v1/crawls/{crawl}); other crawls are not affected"
        )


def server_condition(exc: BaseException) -> bool:
    """True if ``exc`` (a refusal by Redis) is about the server, not about a crawl's keys."""
    if isinstance(exc, FrontierError) and exc.__cause__ is None:
        return False  # the frontier's own refusal of a crawl's state (e.g. its layout)
    cause = exc.__cause__ if isinstance(exc, FrontierError) and exc.__cause__ else exc
    if not isinstance(cause, redis.exceptions.ResponseError):
        return True
    return str(cause).lstrip().startswith(SERVER_CONDITIONS)


TRANSIENT: tuple[type[BaseException], ...] = (ConnectionError_,)
"""Redis could not be reached (every Redis call goes through redcrawl.transport)."""


class StateErrors(APIRoute):
    """A route that answers what a crawl's stored state makes the frontier raise (a
    ValueError on a counter, a DecodeError, a msgpack error, a ConfigError of a bad
    layout...) with :class:`Unreadable`: a JSON 500 naming the crawl, handled like any
    other error (the connection stays usable)."""

    PASS: tuple[type[BaseException], ...] = (
        *TRANSIENT,
        StarletteHTTPException,
        RequestValidationError,
        BodyTooLarge,
        FrontierError,
    )

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def answer(request: Request) -> Response:
            try:
                return await handler(request)
            except self.PASS:
                raise
            except (*REDIS_TRANSIENT, *CLUSTER_TRANSIENT) as exc:
                # a Redis call made outside the frontier (the crawl registry, a snapshot):
                # Redis is down, the crawl is not corrupt (503, not 500 "purge it")
                raise ConnectionError_(f"lost the Redis connection ({exc})") from exc
            except Exception as exc:
                if isinstance(exc, Invalid | Unreadable):
                    raise
                crawl = request.path_params.get("crawl")
                # (in the server's log with its traceback: a bug of ours answers the same
                # 500 as a damaged crawl, and only the traceback tells them apart)
                log.error(
                    "%s %s: answered 500 (crawl state unreadable)",
                    request.method,
                    request.url.path,
                    exc_info=exc,
                )
                raise Unreadable(crawl if isinstance(crawl, str) else None, exc) from exc

        return answer


class ServerRefused(ConnectionError_):
    """The API refuses to use its Redis server (an evicting one, found when ``serve``
    started while it was down): every Redis call answers 503 with the reason."""


class NotReady(ConnectionError_):
    """``/v1/ready`` (no token needed) answers 503 with this message alone: not where the
    Redis is or as whom."""


class Invalid(Exception):
    """A request the schema let through but redcrawl cannot store: answered with 422."""

    def __init__(self, loc: str, msg: str) -> None:
        self.loc, self.msg = loc, clean(msg)
        super().__init__(f"{loc}: {msg}")


def _for_callers(exc: Exception) -> str:
    return str(exc).replace(WORKER_ADVICE, "")


def location(parts: tuple[int | str, ...]) -> str:
    """("body", "requests", 3, "url") -> "requests[3].url" (the tags of the input's
    unions, :data:`~redcrawl.api.inputs.UNION_TAGS`, left out)."""
    out = ""
    for p in parts[1:] if parts and parts[0] in ("body", "path", "query") else parts:
        if p in UNION_TAGS:
            continue
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "body"


RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": m.ErrorOut, "description": "A Host header this API does not answer."},
    401: {"model": m.ErrorOut, "description": "Missing or unknown bearer token."},
    403: {
        "model": m.ErrorOut,
        "description": "A read-only token on an admin endpoint, or a "
        "state-changing call from a foreign Origin.",
    },
    404: {"model": m.ErrorOut, "description": "Unknown crawl (or request)."},
    409: {"model": m.ErrorOut, "description": "Not available on the crawl's backend."},
    413: {"model": m.ErrorOut, "description": "Body over REDCRAWL_API_MAX_BODY; nothing stored."},
    422: {"model": m.ErrorOut, "description": "Invalid input; the message names the field."},
    500: {"model": m.ErrorOut, "description": "The crawl's stored state cannot be read."},
    503: {"model": m.ErrorOut, "description": "Redis is unreachable or refused the operation."},
}


def responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {c: RESPONSES[c] for c in (400, *codes, 500)}


def install(app: FastAPI, settings: Settings) -> None:  # noqa: C901 (one nested handler per error kind, registered together)
    """Register the exception handlers that give every error the JSON shape."""

    # --- errors ----------------------------------------------------------------------
    @app.exception_handler(RequestValidationError)
    async def on_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = []
        for e in exc.errors():
            loc = tuple(e.get("loc", ()))
            msg = str(e.get("msg", "invalid")).removeprefix("Value error, ")
            if loc[:2] == ("path", "crawl"):
                try:
                    validate_crawl_name(str(e.get("input", "")))
                except ConfigError as bad:  # said as the path's, not a setting's
                    msg = bad.problem
            errors.append(m.ErrorItem(loc=clean(location(loc)), msg=clean(msg)))
        detail = "; ".join(f"{x.loc}: {x.msg}" for x in errors[:5])
        if len(errors) > 5:
            detail += f"; and {len(errors) - 5} more"
        return error(422, f"invalid request: {detail}", errors)

    @app.exception_handler(Invalid)
    async def on_invalid(request: Request, exc: Invalid) -> JSONResponse:
        return error(
            422, f"invalid request: {exc.loc}: {exc.msg}", [m.ErrorItem(loc=exc.loc, msg=exc.msg)]
        )

    @app.exception_handler(StarletteHTTPException)
    async def on_http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        headers = dict(exc.headers or {})
        if exc.status_code == 405:  # every method of the path, not only the first route's
            methods: set[str] = set()
            for route in getattr(app.state, "api_routes", ()):
                if route.path_regex.match(request.url.path):
                    methods.update(route.methods or ())
            headers["Allow"] = ", ".join(sorted(methods))
        return error(exc.status_code, str(exc.detail), headers=headers or None)

    @app.exception_handler(BodyTooLarge)
    async def on_too_large(request: Request, exc: BodyTooLarge) -> JSONResponse:
        return error(
            413,
            f"request body too large: the limit is {settings.api_max_body} "
            "bytes (REDCRAWL_API_MAX_BODY); nothing was stored: split the "
            "batch into smaller calls",
            headers={"Connection": "close"},
        )

    @app.exception_handler(Unreadable)
    async def on_unreadable(request: Request, exc: Unreadable) -> JSONResponse:
        return error(500, str(exc))

    def crawl_of(request: Request) -> str | None:
        crawl = request.path_params.get("crawl")
        return crawl if isinstance(crawl, str) else None

    def unavailable(exc: Exception) -> JSONResponse:
        where = redact(settings.redis_url) if settings.redis_url else "the embedded Redis"
        return error(
            503,
            f"Redis ({where}) is unavailable: {_for_callers(exc)}. Check that the server "
            "is running and reachable, then retry.",
        )

    @app.exception_handler(ConnectionError_)
    async def on_lost(request: Request, exc: ConnectionError_) -> JSONResponse:
        return unavailable(exc)

    @app.exception_handler(ServerRefused)
    async def on_refused_server(request: Request, exc: ServerRefused) -> JSONResponse:
        return error(503, str(exc))

    @app.exception_handler(NotReady)
    async def on_not_ready(request: Request, exc: NotReady) -> JSONResponse:
        return error(503, str(exc))

    @app.exception_handler(FrontierError)
    async def on_refused(request: Request, exc: FrontierError) -> JSONResponse:
        if not server_condition(exc):
            return await on_unreadable(request, Unreadable(crawl_of(request), exc))
        return error(
            503, f"{exc}. Check the Redis server's state (memory, replica role, loading) and retry."
        )

    @app.exception_handler(Exception)
    async def on_bug(request: Request, exc: Exception) -> JSONResponse:
        # Reached by what a crawl's stored state can make the frontier raise (ValueError,
        # DecodeError, ConfigError of a bad layout, msgpack errors...): JSON, never text.
        return await on_unreadable(request, Unreadable(crawl_of(request), exc))
