"""The FastAPI application: ``create_app(settings, client=None)``.

Endpoints are plain ``def`` functions, so FastAPI runs their blocking Redis calls in its
threadpool. One Redis client serves the whole app: the one given to :func:`create_app`,
or one made by :func:`redcrawl.connection.connect_bounded` at startup (a short socket
timeout and one retry, so a Redis that is down or hung answers 503 within seconds instead
of hanging requests: :data:`API_SOCKET_TIMEOUT`).

Order of checks for every call: ``Host`` and ``Origin`` (:mod:`redcrawl.api.hosts`), a
declared ``Content-Length`` over the limit (:mod:`redcrawl.api.limits`), the bearer token
(:mod:`redcrawl.api.auth`); only then is a body read, and it is parsed and validated in
the threadpool, never on the event loop (:mod:`redcrawl.api.bodies`). The routes live in
:mod:`redcrawl.api.routes`, one module per resource; errors in :mod:`redcrawl.api.errors`.
"""

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import redis
from fastapi import Depends, FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute
from pydantic.json_schema import models_json_schema

from redcrawl.api import models as m
from redcrawl.api import routes
from redcrawl.api.context import Context, single_values
from redcrawl.api.errors import StateErrors, install
from redcrawl.api.hosts import HostGuard, allowed_hosts
from redcrawl.api.limits import BodyLimit
from redcrawl.connection import connect_bounded
from redcrawl.settings import Settings

__all__ = ["create_app"]

API_VERSION = "1"

API_SOCKET_TIMEOUT = 3.0
"""Seconds a call waits for Redis's reply to a command before the attempt fails (a hung
server: SIGSTOP, a full machine). Every Redis call the API makes is short: purges unlink
(Redis frees the memory in the background), listings are paginated, requeues take 1,000
dead letters at a time."""
API_CONNECT_TIMEOUT = 2.0
"""Seconds a call waits for a connection (a host that drops packets)."""
API_RETRIES = 1
"""Retries of a Redis command (after the first attempt): a hung Redis answers 503 after
about 2 x (API_CONNECT_TIMEOUT + API_SOCKET_TIMEOUT) at worst, a refused one at once."""


def create_app(
    settings: Settings,
    client: redis.Redis | None = None,
    *,
    clock: Callable[[], float] | None = None,
    check_server: bool = False,
) -> FastAPI:
    """The control-plane app. ``client``: a Redis client to use (else one is connected at
    startup and closed at shutdown). ``clock``: monotonic seconds for the rates (default
    :func:`time.monotonic`; tests pass one they can advance). ``check_server``: check the
    server's eviction policy at the first Redis call that reaches it (``serve`` started
    while its Redis was down; an evicting server then answers 503 to every call)."""
    ctx = Context(settings, client, clock=clock, check_server=check_server)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        own = ctx.redis is None
        if own:
            ctx.redis = connect_bounded(
                settings,
                socket_timeout=API_SOCKET_TIMEOUT,
                connect_timeout=API_CONNECT_TIMEOUT,
                retries=API_RETRIES,
            )
        try:
            yield
        finally:
            if own and ctx.redis is not None:
                ctx.redis.close()

    app = FastAPI(
        title="redcrawl control plane",
        version=API_VERSION,
        lifespan=lifespan,
        dependencies=[Depends(single_values)],
        description="Submit requests to crawl frontiers, inspect and steer crawls. "
        "See docs/api.md.",
        docs_url=None,  # (served below: pinned assets with their integrity)
        redoc_url=None,
    )
    app.router.route_class = StateErrors
    app.add_middleware(BodyLimit, limit=settings.api_max_body)
    app.add_middleware(HostGuard, allowed=allowed_hosts(settings))  # outermost: runs first
    install(app, settings)
    routers = [
        module.router(ctx)
        for module in (
            routes.health,
            routes.requests,
            routes.crawls,
            routes.workers,
            routes.hosts,
            routes.metrics,
            routes.dashboard,
        )
    ]
    for router in routers:
        app.include_router(router)
    # every method of a path, for the Allow header of a 405 (see errors.install)
    app.state.api_routes = [
        route for router in routers for route in router.routes if isinstance(route, APIRoute)
    ]

    # --- schema: show the configured batch limit ---------------------------------------
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title, version=app.version, description=app.description, routes=app.routes
            )
            _, defs = models_json_schema(
                [
                    (m.SubmitIn, "validation"),
                    (m.RequeueIn, "validation"),
                    (m.HostOverrideIn, "validation"),
                ],
                ref_template="#/components/schemas/{model}",
            )
            schema.setdefault("components", {}).setdefault("schemas", {}).update(
                defs.get("$defs", {}), MetaValue=m.META_VALUE_SCHEMA
            )
            props = schema["components"]["schemas"]["SubmitIn"]["properties"]
            props["requests"]["maxItems"] = settings.api_max_batch
            props["requests"]["description"] = (
                f"1 to {settings.api_max_batch} requests (REDCRAWL_API_MAX_BATCH)."
            )
            app.openapi_schema = schema
        _block_window(app.openapi_schema)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    _doc_pages(app)
    return app


SWAGGER_UI = "https://cdn.jsdelivr.net/npm/swagger-ui-dist@5.35.0"
REDOC = "https://cdn.jsdelivr.net/npm/redoc@2.5.4"
ASSETS = {
    f"{SWAGGER_UI}/swagger-ui-bundle.js": (
        "sha384-gjRm0bEPMeTmMh5jT2cHccIwCUZSTd8YC+j0d0sXw0MdGEfScduGpSyF3ZSSLkX9"
    ),
    f"{SWAGGER_UI}/swagger-ui.css": (
        "sha384-WlYgdmXYOOBWL5apwjDEZwN+U3HmXSSu5R6V5aGxEcf7z+KuRNwBhoxKVN1i3D5I"
    ),
    f"{REDOC}/bundles/redoc.standalone.js": (
        "sha384-w447zOpYfw/1Tv/5AK9NfHTlQIqE3RVR6KY62jCyy9zNDgO64cMwGGP1Fj0zJVf5"
    ),
}
"""The /docs and /redoc pages' assets: exact versions, each with its Subresource Integrity
(sha384 of the file in the npm package, which the CDN serves as is): a browser runs them
only if they are those bytes. (FastAPI's defaults load whatever swagger-ui-dist 5.x and
redoc 2.x are latest into the API's origin.)"""


def _doc_pages(app: FastAPI) -> None:
    """``/docs`` (Swagger UI) and ``/redoc`` with :data:`ASSETS`."""
    from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
    from fastapi.responses import HTMLResponse

    def pinned(page: HTMLResponse) -> HTMLResponse:
        html = bytes(page.body).decode()
        for url, digest in ASSETS.items():
            html = html.replace(f'"{url}"', f'"{url}" integrity="{digest}" crossorigin="anonymous"')
        return HTMLResponse(html)

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        return pinned(
            get_swagger_ui_html(
                openapi_url="/openapi.json",
                title=f"{app.title} - Swagger UI",
                swagger_js_url=f"{SWAGGER_UI}/swagger-ui-bundle.js",
                swagger_css_url=f"{SWAGGER_UI}/swagger-ui.css",
                swagger_favicon_url="data:,",
            )
        )

    @app.get("/redoc", include_in_schema=False)
    def redoc() -> HTMLResponse:
        return pinned(
            get_redoc_html(
                openapi_url="/openapi.json",
                title=f"{app.title} - ReDoc",
                redoc_js_url=f"{REDOC}/bundles/redoc.standalone.js",
                redoc_favicon_url="data:,",
                with_google_fonts=False,
            )
        )


def _block_window(schema: dict[str, Any]) -> None:
    """The bounds of ``block_until`` as of now (a day back, 30 days ahead on the server's
    clock; an hour inside that window, for clocks apart and a schema read a while ago)."""
    import time

    from redcrawl.politeness.hosts import MAX_BLOCK, PAST_BLOCK

    now = time.time()
    prop = schema["components"]["schemas"]["HostOverrideIn"]["properties"]["block_until"]
    for choice in prop.get("anyOf", [prop]):
        if choice.get("type") == "number":
            choice["minimum"] = int(now - PAST_BLOCK + 3600)
            choice["maximum"] = int(now + MAX_BLOCK - 3600)
