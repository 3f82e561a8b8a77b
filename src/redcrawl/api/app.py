"""The FastAPI application: ``create_app(settings, client=None)``.

Endpoints are plain ``def`` functions, so FastAPI runs their blocking Redis calls in its
threadpool. One Redis client serves the whole app: the one given to :func:`create_app`,
or one made by :func:`redcrawl.connection.connect` at startup (with few retries, so a
Redis outage answers 503 quickly instead of hanging requests).

Order of checks for every call: ``Host`` and ``Origin`` (:mod:`redcrawl.api.hosts`), a
declared ``Content-Length`` over the limit (:mod:`redcrawl.api.limits`), the bearer token
(:mod:`redcrawl.api.auth`); only then is a body read, and it is parsed and validated in
the threadpool, never on the event loop. Bodies are declared in the OpenAPI schema by hand
(``openapi_extra``) because FastAPI would read and parse them before any dependency runs.
"""

import base64
import dataclasses
import math
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from contextlib import asynccontextmanager
from functools import lru_cache
from typing import Annotated, Any, TypeVar

import redis
import redis.exceptions
import scrapy
from fastapi import Depends, FastAPI, HTTPException, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from pydantic.json_schema import models_json_schema
from redis.backoff import ExponentialBackoff
from redis.retry import Retry
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from redcrawl import codec
from redcrawl.api import models as m
from redcrawl.api.auth import require
from redcrawl.api.hosts import HostGuard, allowed_hosts
from redcrawl.api.limits import BodyLimit, BodyTooLarge
from redcrawl.api.rates import RateBook
from redcrawl.codec import Envelope
from redcrawl.connection import connect, redact
from redcrawl.errors import (
    ConfigError,
    ConnectionError_,
    EncodeError,
    FrontierError,
)
from redcrawl.fingerprint import canonicalizer_for, request_fingerprint
from redcrawl.frontier import Counts, Frontier, StreamsFrontier, open_frontier
from redcrawl.keys import (
    CRAWL_NAME_PATTERN,
    CrawlKeys,
    crawl_of_stats_key,
    stats_key_pattern,
    validate_crawl_name,
)
from redcrawl.settings import Settings

__all__ = ["create_app", "frontier_for"]

API_VERSION = "1"
M = TypeVar("M", bound=BaseModel)

SERVER_CONDITIONS = ("OOM", "READONLY", "LOADING", "MASTERDOWN", "BUSY", "NOREPLICAS",
                     "CLUSTERDOWN", "TRYAGAIN", "NOAUTH", "NOPERM")
"""Redis error prefixes that describe the server's state (answered 503: retry later);
any other refusal of a frontier step comes from what a crawl's keys hold."""


def frontier_for(client: redis.Redis, settings: Settings, crawl: str) -> Frontier:
    """The frontier of ``crawl``: the one place that picks a backend."""
    return open_frontier(client, settings, crawl, follow_layout=True)


def _clean(text: str) -> str:
    """``text`` safe to put in a JSON response (no lone surrogates)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _jsonable(value: Any) -> Any:
    """Stored meta as JSON: bytes as text, non-finite floats as strings."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {_clean(str(k)): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, str):
        return _clean(value)
    return value


def _error(status_code: int, detail: str, errors: list[m.ErrorItem] | None = None,
           headers: Mapping[str, str] | None = None) -> JSONResponse:
    body = m.ErrorOut(detail=_clean(detail), errors=errors)
    return JSONResponse(body.model_dump(exclude_none=True), status_code,
                        headers=dict(headers) if headers else None)


class Unreadable(Exception):
    """The stored state of a crawl cannot be read (a key written by something else than
    redcrawl, or corrupt): answered with 500 and redcrawl's error shape."""

    def __init__(self, crawl: str | None, cause: BaseException) -> None:
        self.crawl, self.cause = crawl, cause
        name = f"crawl {crawl!r}" if crawl else "a crawl"
        super().__init__(
            f"the stored state of {name} cannot be read ({type(cause).__name__}: "
            f"{_clean(str(cause))[:500]}): one of its keys was written by something else "
            "than redcrawl or is corrupt. Inspect its keys with redis-cli, or purge it "
            "(DELETE /v1/crawls/{crawl}); other crawls are not affected")


def _server_condition(exc: BaseException) -> bool:
    """True if ``exc`` (a refusal by Redis) is about the server, not about a crawl's keys."""
    cause = exc.__cause__ if isinstance(exc, FrontierError) and exc.__cause__ else exc
    if not isinstance(cause, redis.exceptions.ResponseError):
        return True
    return str(cause).lstrip().startswith(SERVER_CONDITIONS)


TRANSIENT: tuple[type[BaseException], ...] = (
    ConnectionError_, redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)


class StateErrors(APIRoute):
    """A route that answers what a crawl's stored state makes the frontier raise (a
    ValueError on a counter, a DecodeError, a msgpack error, a ConfigError of a bad
    layout...) with :class:`Unreadable`: a JSON 500 naming the crawl, handled like any
    other error (the connection stays usable)."""

    PASS: tuple[type[BaseException], ...] = (
        *TRANSIENT, StarletteHTTPException, RequestValidationError, BodyTooLarge,
        FrontierError, redis.exceptions.ResponseError)

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def answer(request: Request) -> Response:
            try:
                return await handler(request)
            except self.PASS:
                raise
            except Exception as exc:
                if isinstance(exc, Invalid | Unreadable):
                    raise
                crawl = request.path_params.get("crawl")
                raise Unreadable(crawl if isinstance(crawl, str) else None, exc) from exc

        return answer


def _parse(model: type[M], raw: bytes) -> M:
    """``raw`` (a JSON body) as ``model``, strictly; RequestValidationError if it is not.
    Runs in the threadpool (a 16 MiB body takes seconds)."""
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise RequestValidationError([
            {"loc": ("body", *e["loc"]), "msg": e["msg"], "type": e["type"]}
            for e in exc.errors(include_url=False, include_input=False)]) from None


def _body_doc(model: type[BaseModel], required: bool = True) -> dict[str, Any]:
    """The ``requestBody`` of an endpoint that reads its body itself."""
    return {"requestBody": {"required": required, "content": {"application/json": {
        "schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}}


async def _raw_body(request: Request) -> bytes:
    """The request body, read only once the token was accepted (a dependency listed after
    the access check)."""
    return await request.body()


RawBody = Annotated[bytes, Depends(_raw_body)]


class Invalid(Exception):
    """A request the schema let through but redcrawl cannot store: answered with 422."""

    def __init__(self, loc: str, msg: str) -> None:
        self.loc, self.msg = loc, _clean(msg)
        super().__init__(f"{loc}: {msg}")


def _loc(parts: tuple[int | str, ...]) -> str:
    """("body", "requests", 3, "url") -> "requests[3].url"."""
    out = ""
    for p in parts[1:] if parts and parts[0] in ("body", "path", "query") else parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "body"


_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": m.ErrorOut, "description": "A Host header this API does not answer."},
    401: {"model": m.ErrorOut, "description": "Missing or unknown bearer token."},
    403: {"model": m.ErrorOut, "description": "A read-only token on an admin endpoint, or a "
                                              "state-changing call from a foreign Origin."},
    404: {"model": m.ErrorOut, "description": "Unknown crawl (or request)."},
    409: {"model": m.ErrorOut, "description": "Not available on the crawl's backend."},
    413: {"model": m.ErrorOut, "description": "Body over REDCRAWL_API_MAX_BODY; nothing stored."},
    422: {"model": m.ErrorOut, "description": "Invalid input; the message names the field."},
    500: {"model": m.ErrorOut, "description": "The crawl's stored state cannot be read."},
    503: {"model": m.ErrorOut, "description": "Redis is unreachable or refused the operation."},
}


def _responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {c: _RESPONSES[c] for c in (400, *codes, 500)}


def create_app(settings: Settings, client: redis.Redis | None = None) -> FastAPI:
    """The control-plane app. ``client``: a Redis client to use (else one is connected at
    startup and closed at shutdown)."""
    state: dict[str, Any] = {"client": client}
    rates = RateBook()
    canonicalizer = canonicalizer_for(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        own = state["client"] is None
        if own:
            state["client"] = connect(
                settings, check=False, retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), 2),
                socket_timeout=10, socket_connect_timeout=3)
        try:
            yield
        finally:
            if own:
                state["client"].close()

    app = FastAPI(
        title="redcrawl control plane", version=API_VERSION, lifespan=lifespan,
        description="Submit requests to crawl frontiers, inspect and steer crawls. "
                    "See docs/api.md.",
    )
    app.router.route_class = StateErrors
    app.add_middleware(BodyLimit, limit=settings.api_max_body)
    app.add_middleware(HostGuard, allowed=allowed_hosts(settings))  # outermost: runs first

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
                except ConfigError as bad:
                    msg = str(bad)
            errors.append(m.ErrorItem(loc=_clean(_loc(loc)), msg=_clean(msg)))
        detail = "; ".join(f"{x.loc}: {x.msg}" for x in errors[:5])
        if len(errors) > 5:
            detail += f"; and {len(errors) - 5} more"
        return _error(422, f"invalid request: {detail}", errors)

    @app.exception_handler(Invalid)
    async def on_invalid(request: Request, exc: Invalid) -> JSONResponse:
        return _error(422, f"invalid request: {exc.loc}: {exc.msg}",
                      [m.ErrorItem(loc=exc.loc, msg=exc.msg)])

    @app.exception_handler(StarletteHTTPException)
    async def on_http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        headers = dict(exc.headers or {})
        if exc.status_code == 405:  # every method of the path, not only the first route's
            methods: set[str] = set()
            for route in app.router.routes:
                match, _ = route.matches(request.scope)
                if match != Match.NONE:
                    methods.update(getattr(route, "methods", None) or ())
            headers["Allow"] = ", ".join(sorted(methods))
        return _error(exc.status_code, str(exc.detail), headers=headers or None)

    @app.exception_handler(BodyTooLarge)
    async def on_too_large(request: Request, exc: BodyTooLarge) -> JSONResponse:
        return _error(413, f"request body too large: the limit is {settings.api_max_body} "
                           "bytes (REDCRAWL_API_MAX_BODY); nothing was stored: split the "
                           "batch into smaller calls", headers={"Connection": "close"})

    @app.exception_handler(Unreadable)
    async def on_unreadable(request: Request, exc: Unreadable) -> JSONResponse:
        return _error(500, str(exc))

    def crawl_of(request: Request) -> str | None:
        crawl = request.path_params.get("crawl")
        return crawl if isinstance(crawl, str) else None

    def unavailable(exc: Exception) -> JSONResponse:
        where = redact(settings.redis_url) if settings.redis_url else "the embedded Redis"
        return _error(503, f"Redis ({where}) is unavailable: {exc}. Check that the server "
                           "is running and reachable, then retry.")

    @app.exception_handler(ConnectionError_)
    async def on_lost(request: Request, exc: ConnectionError_) -> JSONResponse:
        return unavailable(exc)

    @app.exception_handler(redis.exceptions.ConnectionError)
    async def on_redis_down(request: Request, exc: Exception) -> JSONResponse:
        return unavailable(exc)

    @app.exception_handler(redis.exceptions.TimeoutError)
    async def on_redis_slow(request: Request, exc: Exception) -> JSONResponse:
        return unavailable(exc)

    @app.exception_handler(FrontierError)
    async def on_refused(request: Request, exc: FrontierError) -> JSONResponse:
        if not _server_condition(exc):
            return await on_unreadable(request, Unreadable(crawl_of(request), exc))
        return _error(503, f"{exc}. Check the Redis server's state (memory, replica "
                           "role, loading) and retry.")

    @app.exception_handler(redis.exceptions.ResponseError)
    async def on_redis_refused(request: Request, exc: Exception) -> JSONResponse:
        if not _server_condition(exc):
            return await on_unreadable(request, Unreadable(crawl_of(request), exc))
        return _error(503, f"Redis refused the operation: {exc}. Check the Redis server's "
                           "state (memory, replica role, loading) and retry.")

    @app.exception_handler(Exception)
    async def on_bug(request: Request, exc: Exception) -> JSONResponse:
        # Reached by what a crawl's stored state can make the frontier raise (ValueError,
        # DecodeError, ConfigError of a bad layout, msgpack errors...): JSON, never text.
        return await on_unreadable(request, Unreadable(crawl_of(request), exc))

    # --- plumbing --------------------------------------------------------------------
    read = [Depends(require(settings, "read"))]
    admin = [Depends(require(settings, "admin"))]

    def redis_client() -> Any:
        return state["client"]

    @lru_cache(maxsize=256)
    def frontier(crawl: str) -> Frontier:
        return frontier_for(redis_client(), settings, crawl)

    def stats_key(crawl: str) -> str:
        return CrawlKeys(crawl, prefix=settings.key_prefix, tiers=settings.tiers).stats

    def alive(crawls: list[str]) -> list[bool]:
        """Whether each crawl exists: its stats hold counts (a purge leaves only the id
        counters behind, so a purged crawl is gone until a request is submitted again).
        A stats key that is not a hash counts as existing (it is reported as corrupt)."""
        pipe = redis_client().pipeline(transaction=False)
        for crawl in crawls:
            pipe.hmget(stats_key(crawl), "accepted", "filtered")
        return [not isinstance(r, list) or any(x is not None for x in r)
                for r in pipe.execute(raise_on_error=False)]

    def existing(crawl: str) -> Frontier:
        if not alive([crawl])[0]:
            raise HTTPException(404, f"crawl {crawl!r} does not exist (no request was "
                                     "submitted to it since it was created or purged); list "
                                     "crawls with GET /v1/crawls")
        return frontier(crawl)

    def summary(crawl: str, c: Counts) -> dict[str, Any]:
        """The counts as fields of a response (derived from :class:`Counts`)."""
        return {"crawl": crawl, **dataclasses.asdict(c), "finished": c.finished}

    Crawl = Annotated[str, Path(pattern=CRAWL_NAME_PATTERN, description="Crawl name.")]
    Limit = Annotated[int, Query(ge=1, le=m.MAX_LIST_LIMIT, description="Most items returned.")]

    # --- health ----------------------------------------------------------------------
    @app.get("/v1/health", tags=["health"], summary="The API process is up",
             responses={400: _RESPONSES[400]})
    def health() -> m.Health:
        return m.Health(status="ok")

    @app.get("/v1/ready", tags=["health"], summary="Redis answers",
             responses=_responses(503))
    def ready() -> m.Health:
        redis_client().ping()
        return m.Health(status="ok")

    # --- submit ----------------------------------------------------------------------
    def envelope(i: int, item: m.RequestIn) -> Envelope:
        where = f"requests[{i}]"
        try:
            body = item.body_bytes()
        except ValueError as exc:
            raise Invalid(f"{where}.body", str(exc)) from None
        try:
            request = scrapy.Request(item.url, method=item.method.upper(),
                                     headers=item.header_pairs(), body=body,
                                     priority=item.priority, dont_filter=item.dont_filter,
                                     meta=item.meta)
            fp = None if item.dont_filter else request_fingerprint(
                request, canonicalizer=canonicalizer,
                version_meta_key=settings.fingerprint_version_meta)
        except (ValueError, TypeError) as exc:
            raise Invalid(f"{where}.url", f"cannot build a request from it: {exc}") from None
        try:
            env = codec.from_request(request, None, fingerprint=fp)
            env.callback = item.callback
            env.dont_filter = fp is None
            codec.encode(env)  # nothing is written unless every request can be stored
        except EncodeError as exc:
            text = str(exc)
            field = "meta" if text.startswith("meta") else "url" if "URL" in text else ""
            raise Invalid(f"{where}.{field}" if field else where, text) from None
        return env

    @app.post("/v1/crawls/{crawl}/requests", tags=["requests"], dependencies=admin,
              summary="Submit one request or a batch (deduplicated like the scheduler)",
              responses=_responses(401, 403, 413, 422, 503),
              openapi_extra=_body_doc(m.SubmitIn), response_model_exclude_none=True)
    def submit(crawl: Crawl, raw: RawBody) -> m.SubmitOut:
        payload = _parse(m.SubmitIn, raw)
        items = payload.requests
        if len(items) > settings.api_max_batch:
            raise Invalid("requests", f"{len(items)} requests; send at most "
                                      f"{settings.api_max_batch} per call "
                                      "(REDCRAWL_API_MAX_BATCH)")
        envs = [envelope(i, item) for i, item in enumerate(items)]
        groups: dict[float, list[int]] = {}
        for i, item in enumerate(items):
            groups.setdefault(item.delay, []).append(i)
        flags: list[bool] = [False] * len(items)
        f = frontier(crawl)
        for delay, idx in groups.items():
            result = f.push([envs[i] for i in idx], delay=delay, recrawl=payload.recrawl)
            for i, flag in zip(idx, result.flags, strict=True):
                flags[i] = flag
        accepted = sum(flags)
        out = [m.SubmitItem(accepted=flag, id=env.fingerprint.hex() if env.fingerprint
                            else None) for flag, env in zip(flags, envs, strict=True)]
        return m.SubmitOut(crawl=crawl, accepted=accepted, filtered=len(flags) - accepted,
                           items=out)

    # --- inspect ---------------------------------------------------------------------
    @app.get("/v1/crawls", tags=["crawls"], dependencies=read,
             summary="Crawls (every crawl that ever received a request) with their counts",
             responses=_responses(401, 422, 503))
    def list_crawls(limit: Limit = 100) -> m.CrawlList:
        names: set[str] = set()
        pattern = stats_key_pattern(settings.key_prefix)
        for key in redis_client().scan_iter(match=pattern, count=1000):
            name = crawl_of_stats_key(key, settings.key_prefix)
            if name is not None:
                names.add(name)
        ordered = sorted(names)
        ordered = [n for n, ok in zip(ordered, alive(ordered), strict=True) if ok]
        out = []
        for name in ordered[:limit]:
            try:
                c = frontier(name).counts()
            except TRANSIENT:
                raise
            except Exception as exc:  # one broken crawl must not hide the others
                if isinstance(exc, FrontierError | redis.exceptions.ResponseError) and \
                        _server_condition(exc):
                    raise
                out.append(m.CrawlListItem(crawl=name, error=str(Unreadable(name, exc))))
                continue
            rates.observe(name, c.done, c.accepted)
            out.append(m.CrawlListItem(**summary(name, c)))
        return m.CrawlList(crawls=out)

    @app.get("/v1/crawls/{crawl}", tags=["crawls"], dependencies=read,
             summary="One crawl: counts, paused, workers alive, rates (per API process)",
             responses=_responses(401, 404, 422, 503))
    def crawl_detail(crawl: Crawl) -> m.CrawlDetail:
        f = existing(crawl)
        c = f.counts()
        now = server_time()
        alive = sum(1 for deadline in f.workers().values() if deadline > now)
        return m.CrawlDetail(**summary(crawl, c), paused=f.is_paused(), workers_alive=alive,
                             rates=rates.observe(crawl, c.done, c.accepted))

    def server_time() -> float:
        sec, usec = redis_client().time()
        return float(sec) + float(usec) / 1e6

    @app.get("/v1/crawls/{crawl}/pending", tags=["crawls"], dependencies=read,
             summary="Ready requests, next served first within each tier",
             responses=_responses(401, 404, 422, 503))
    def pending(crawl: Crawl, limit: Limit = 100) -> m.PendingList:
        items = existing(crawl).pending(limit)
        return m.PendingList(crawl=crawl, items=[m.PendingItem.model_validate(p)
                                                 for p in items])

    @app.get("/v1/crawls/{crawl}/inflight", tags=["crawls"], dependencies=read,
             summary="Leased requests: worker, since, deadline",
             responses=_responses(401, 404, 422, 503))
    def inflight(crawl: Crawl, limit: Limit = 100) -> m.InflightList:
        items = existing(crawl).inflight(limit)
        return m.InflightList(crawl=crawl, items=[m.InflightItem.model_validate(x)
                                                  for x in items])

    @app.get("/v1/crawls/{crawl}/shards", tags=["crawls"], dependencies=read,
             summary="Streams backend: per shard and stream, length, pending entries with "
                     "their consumer, idle time and delivery count",
             responses=_responses(401, 404, 409, 422, 503))
    def shards(crawl: Crawl, limit: Limit = 100) -> m.ShardList:
        f = existing(crawl)
        if not isinstance(f, StreamsFrontier):
            raise HTTPException(409, f"crawl {crawl!r} uses the lists backend; shards exist "
                                     "only on the streams backend (REDCRAWL_BACKEND=streams)")
        return m.ShardList(crawl=crawl, shards=f.settings.shards,
                           streams=[m.ShardItem.model_validate(s) for s in f.shards(limit)])

    @app.get("/v1/crawls/{crawl}/dead", tags=["crawls"], dependencies=read,
             summary="Dead-lettered requests with their last error, oldest first",
             responses=_responses(401, 404, 422, 503))
    def dead(crawl: Crawl, limit: Limit = 100) -> m.DeadList:
        items = existing(crawl).dead(limit)
        return m.DeadList(crawl=crawl, items=[m.DeadItem.model_validate(x) for x in items])

    @app.get("/v1/crawls/{crawl}/requests/{request_id}", tags=["requests"],
             dependencies=read, summary="Where one stored request is (404 if unknown or done)",
             responses=_responses(401, 404, 422, 503))
    def describe(crawl: Crawl,
                 request_id: Annotated[str, Path(pattern=m.REQUEST_ID_PATTERN,
                                                 description="40 hex digits or #<seq> "
                                                             "(as %23<seq> in the URL).")],
                 ) -> m.RequestDetail:
        info = existing(crawl).describe(request_id)
        if info is None:
            raise HTTPException(404, f"request {request_id} is not stored in crawl {crawl!r}: "
                                     "it is unknown, or done (done requests are only "
                                     "remembered by their fingerprint)")
        env = info.envelope
        text: str | None = None
        b64 = False
        if env is not None:
            try:
                text = env.body.decode("utf-8")
            except UnicodeDecodeError:
                text, b64 = base64.b64encode(env.body).decode("ascii"), True
        return m.RequestDetail(
            crawl=crawl, id=info.id, state=info.state,  # type: ignore[arg-type]
            attempts=info.attempts, worker=info.worker, due=info.due,
            error=_clean(info.error) if info.error is not None else None,
            url=env.url if env else None, method=env.method if env else None,
            headers=[[k.decode("latin-1"), v.decode("latin-1")] for k, vs in env.headers
                     for v in vs] if env else None,
            body=text, body_base64=b64, meta=_jsonable(env.meta) if env else None,
            callback=env.callback if env else None, priority=env.priority if env else None,
            dont_filter=env.dont_filter if env else None)

    @app.get("/v1/crawls/{crawl}/workers", tags=["workers"], dependencies=read,
             summary="Workers that heartbeat into the crawl",
             responses=_responses(401, 404, 422, 503))
    def workers(crawl: Crawl) -> m.WorkerList:
        beats = existing(crawl).workers()
        now = server_time()
        return m.WorkerList(crawl=crawl, server_time=now, workers=[
            m.WorkerItem(worker=w, heartbeat_deadline=d, alive=d > now)
            for w, d in sorted(beats.items())])

    # --- steer -----------------------------------------------------------------------
    @app.post("/v1/crawls/{crawl}/dead/requeue", tags=["requests"], dependencies=admin,
              summary="Dead letters back to ready with a fresh attempt budget",
              responses=_responses(401, 403, 404, 413, 422, 503),
              openapi_extra=_body_doc(m.RequeueIn, required=False))
    def requeue(crawl: Crawl, raw: RawBody) -> m.RequeuedOut:
        payload = _parse(m.RequeueIn, raw) if raw.strip() else m.RequeueIn()
        f = existing(crawl)
        n = f.requeue_dead(payload.ids, limit=payload.limit)
        return m.RequeuedOut(crawl=crawl, requeued=n)

    @app.post("/v1/crawls/{crawl}/workers/{worker}/reclaim", tags=["workers"],
              dependencies=admin, summary="Give a worker's leased requests back to the queue",
              responses=_responses(401, 403, 404, 422, 503))
    def reclaim(crawl: Crawl,
                worker: Annotated[str, Path(min_length=1, max_length=512)]) -> m.ReclaimedOut:
        n = existing(crawl).release_worker(worker)
        return m.ReclaimedOut(crawl=crawl, worker=worker, reclaimed=n)

    def switch(crawl: str, action: Callable[[Frontier], None]) -> m.PausedOut:
        f = existing(crawl)
        action(f)
        return m.PausedOut(crawl=crawl, paused=f.is_paused())

    @app.post("/v1/crawls/{crawl}/pause", tags=["crawls"], dependencies=admin,
              summary="Stop handing out requests (pushes still accepted)",
              responses=_responses(401, 403, 404, 422, 503))
    def pause(crawl: Crawl) -> m.PausedOut:
        return switch(crawl, lambda f: f.pause())

    @app.post("/v1/crawls/{crawl}/resume", tags=["crawls"], dependencies=admin,
              summary="Hand out requests again", responses=_responses(401, 403, 404, 422, 503))
    def resume(crawl: Crawl) -> m.PausedOut:
        return switch(crawl, lambda f: f.resume())

    @app.delete("/v1/crawls/{crawl}", tags=["crawls"], dependencies=admin,
                summary="Purge the crawl's frontier: queues, leases, dead letters, dedupe",
                responses=_responses(401, 403, 404, 422, 503))
    def purge(crawl: Crawl) -> m.PurgedOut:
        existing(crawl).purge()
        return m.PurgedOut(crawl=crawl, purged=True)

    # --- schema: show the configured batch limit ---------------------------------------
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version,
                                 description=app.description, routes=app.routes)
            _, defs = models_json_schema([(m.SubmitIn, "validation"),
                                          (m.RequeueIn, "validation")],
                                         ref_template="#/components/schemas/{model}")
            schema.setdefault("components", {}).setdefault("schemas", {}).update(
                defs.get("$defs", {}), MetaValue=m.META_VALUE_SCHEMA)
            props = schema["components"]["schemas"]["SubmitIn"]["properties"]
            props["requests"]["maxItems"] = settings.api_max_batch
            props["requests"]["description"] = (
                f"1 to {settings.api_max_batch} requests (REDCRAWL_API_MAX_BATCH).")
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app

