"""A site pushing back (HTTP 429/503), handled for the fleet: ``redcrawl.scrapy.DeferMiddleware``.

A downloader middleware redcrawl's scheduler installs by itself when the crawl has
fleet-wide politeness (lists backend, ``REDCRAWL_POLITENESS``), just ahead of Scrapy's
``RetryMiddleware``: it sees a response before Scrapy would retry it (which would send
the request straight back to the same site from the same worker). A response whose
status is in ``REDCRAWL_DEFER_HTTP_CODES`` (default 429, 503), of a request the scheduler
handed out, is *deferred* (:meth:`redcrawl.frontier.FrontierCore.defer`): the request goes
back to the front of its site's queue without spending an attempt (after
``REDCRAWL_MAX_DEFERRALS`` deferrals, to the dead letters with the reason), and the site
is blocked for every worker until its ``Retry-After`` (capped by
``REDCRAWL_RETRY_AFTER_CAP``) or, without a usable one, for the backoff delay of its
failures (:class:`redcrawl.politeness.BackoffPolicy`). The response is dropped here: the
middleware raises :class:`RequestDeferred` (an ``IgnoreRequest``; a request's errback sees
it, as any ``IgnoreRequest``), and the worker does not acknowledge the request.

Not deferred (the response goes on as Scrapy would handle it): requests that handle the
status themselves (``meta["handle_httpstatus_all"]``, ``handle_httpstatus_list`` in meta
or on the spider, ``meta["dont_retry"]``), and requests the scheduler did not hand out
(e.g. robots.txt downloads). Their site is blocked all the same when the response reaches
the scheduler (``response_received``).

Stats: ``redcrawl/deferred/<status>`` (this worker), and crawl-wide in Redis
(``FrontierCore.politeness_stats``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from scrapy.downloadermiddlewares.retry import RetryMiddleware
from scrapy.exceptions import IgnoreRequest, NotConfigured

from redcrawl.scrapy import lifecycle
from redcrawl.settings import Settings

if TYPE_CHECKING:
    import scrapy
    from scrapy.crawler import Crawler
    from scrapy.http import Response

__all__ = ["DeferMiddleware", "RequestDeferred", "handles_status", "install"]

log = logging.getLogger(__name__)


class RequestDeferred(IgnoreRequest):
    """The site pushed back and the request was deferred in the frontier (it will be
    fetched again later, possibly by another worker)."""


def handles_status(request: scrapy.Request, status: int, spider: Any) -> bool:
    """Whether the request (or its spider) takes this status as a response of its own, or
    asked not to be retried: then it is not deferred."""
    meta = request.meta
    return bool(
        meta.get("dont_retry")
        or meta.get("handle_httpstatus_all")
        or status in meta.get("handle_httpstatus_list", ())
        or status in getattr(spider, "handle_httpstatus_list", ())
    )


class DeferMiddleware:
    """Downloader middleware: defer the requests a site pushed back (see the module
    docstring). Installed by the scheduler; listing it in ``DOWNLOADER_MIDDLEWARES``
    works too (give it an order above ``RetryMiddleware``'s, e.g. 560)."""

    def __init__(self, crawler: Crawler, codes: tuple[int, ...]) -> None:
        self.crawler = crawler
        self.codes = frozenset(codes)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> DeferMiddleware:
        with lifecycle.refusing_config_errors(crawler):
            codes = Settings.from_scrapy(crawler.settings).defer_http_codes
        if not codes:
            raise NotConfigured("REDCRAWL_DEFER_HTTP_CODES is empty")
        return cls(crawler, codes)

    def process_response(
        self, request: scrapy.Request, response: Response, spider: Any = None
    ) -> Response:
        if response.status not in self.codes:
            return response
        scheduler = lifecycle.scheduler_of(self.crawler)
        defer = getattr(scheduler, "defer_response", None)
        if defer is None or not defer(request, response):
            return response
        raise RequestDeferred(
            f"{response.status} from {request.url}: deferred (the site is blocked for "
            "the fleet; the request comes back later)"
        )


def install(crawler: Crawler, scheduler: Any) -> DeferMiddleware | None:
    """Called by redcrawl's scheduler at open for a crawl with politeness: put
    :class:`DeferMiddleware` just ahead of Scrapy's ``RetryMiddleware`` (process_response
    runs from the downloader towards the engine; without ``RetryMiddleware``, last before
    the engine), unless the project listed it, and add the scheduler's hook for download
    errors (``scheduler.on_download_error``) as the outermost process_exception (it sees
    an exception only once Scrapy's retries gave up). Returns the middleware in use."""
    manager = getattr(getattr(crawler.engine, "downloader", None), "middleware", None)
    methods = getattr(manager, "methods", None)
    if manager is None or methods is None or "process_response" not in methods:
        log.warning(
            "redcrawl: Scrapy %s: could not add DeferMiddleware; 429/503 responses are "
            "retried by Scrapy, not deferred for the fleet",
            lifecycle._scrapy_version(),
        )
        return None
    hook = getattr(scheduler, "on_download_error", None)
    if hook is not None and "process_exception" in methods:
        methods["process_exception"].append(hook)
    middlewares = tuple(getattr(manager, "middlewares", ()))
    ours = next((mw for mw in middlewares if isinstance(mw, DeferMiddleware)), None)
    if ours is not None:
        return ours
    try:
        ours = lifecycle.build_component(DeferMiddleware, crawler)
    except NotConfigured:
        log.info("redcrawl: REDCRAWL_DEFER_HTTP_CODES is empty: nothing is deferred")
        return None
    assert isinstance(ours, DeferMiddleware)
    chain = methods["process_response"]
    at = next(
        (
            i
            for i, m in enumerate(chain)
            if isinstance(getattr(m, "__self__", None), RetryMiddleware)
        ),
        len(chain),
    )
    chain.insert(at, ours.process_response)
    manager.middlewares = (*middlewares, ours)
    log.info(
        "redcrawl: a response %s defers its request in the frontier (no attempt spent) "
        "and blocks its site for the fleet (Retry-After, else backoff), before Scrapy's "
        "RetryMiddleware sees it (REDCRAWL_DEFER_HTTP_CODES)",
        "/".join(map(str, sorted(ours.codes))),
    )
    return ours
