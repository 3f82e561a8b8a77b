"""robots.txt once per site for the whole fleet: ``redcrawl.scrapy.RobotsTxtMiddleware``.

A downloader middleware used in place of Scrapy's ``RobotsTxtMiddleware`` when
``ROBOTSTXT_OBEY`` is on. redcrawl's scheduler installs it by itself, at the place of
Scrapy's (``REDCRAWL_ROBOTS_SHARED = False`` keeps Scrapy's); listing it in
``DOWNLOADER_MIDDLEWARES`` works too, and Scrapy's is then taken out (a startup note says
so: both would fetch robots.txt).

* **Once for the fleet.** An origin's robots.txt is looked up in the crawl's cache in Redis
  (:class:`redcrawl.politeness.robots.RobotsCache`); on a miss one worker takes the
  origin's lock and downloads it (through the engine, as Scrapy's middleware does), the
  others poll the cache every :data:`POLL` seconds until it is there. Redis is only called
  from a thread of this middleware's own, never on the reactor.
* **Every waiting request is checked.** Each request waiting for the same robots.txt gets
  its own Deferred and is checked against the rules when they come (Scrapy 2.19 checks
  only the first: its waiters share one Deferred whose result the first one consumes).
* **Disallowed** requests raise ``IgnoreRequest`` without a fetch (stat
  ``redcrawl/robots/disallowed``, and Scrapy's ``robotstxt/forbidden``); the scheduler
  acknowledges them (DONE), as every ``IgnoreRequest`` from a downloader middleware.
  On redcrawl's scheduler they are also counted for the whole crawl in Redis (field
  ``robots_disallowed`` of the crawl's stats hash, added with the worker's heartbeat:
  ``redcrawl_robots_disallowed_total``, ``redcrawl status``, the dashboard).
* **Crawl-delay** becomes the ``crawl_delay`` field of the host's politeness override
  (:attr:`redcrawl.keys.CrawlKeys.pol_override`), capped by
  ``REDCRAWL_ROBOTS_MAX_CRAWL_DELAY`` (logged once per host when the cap bites); the
  frontier enforces it for the fleet. On a partitioned crawl the override is the
  partition's that owns the host's key; the cache stays at the crawl's anchor.
* **Errors:** a 4xx allows everything; a 5xx (after Scrapy's retries) or a failed download
  allows everything too, as Scrapy does, and is cached for ``REDCRAWL_ROBOTS_ERROR_TTL``
  only. ``ROBOTSTXT_PARSER`` and ``ROBOTSTXT_USER_AGENT`` are honoured, and the
  ``robots_parsed`` signal is sent as Scrapy does (once per origin and worker).

How an origin's robots.txt is found, downloaded and cached is
:class:`redcrawl.scrapy.robots_fetch.RobotsFetcher` (the middleware's base class); this
module checks requests against it and puts the middleware in place.

Stats: ``redcrawl/robots/fetched`` (downloaded by this worker), ``redcrawl/robots/cached``
(taken from the fleet's cache), ``redcrawl/robots/disallowed``, ``redcrawl/robots/errors``
(5xx or failed downloads), ``redcrawl/robots/crawl_delay_capped``.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, cast

from scrapy import signals
from scrapy.downloadermiddlewares.robotstxt import RobotsTxtMiddleware as ScrapyRobotsTxt
from scrapy.exceptions import IgnoreRequest, NotConfigured
from scrapy.http import Request
from scrapy.utils.httpobj import urlparse_cached
from twisted.internet.defer import Deferred

from redcrawl.keys import CrawlKeys
from redcrawl.scrapy import counters, lifecycle
from redcrawl.scrapy.one_off import one_off_command
from redcrawl.scrapy.robots_fetch import _MISSING, RobotsFetcher
from redcrawl.scrapy.robots_fetch import LOCAL_MAX as LOCAL_MAX  # (re-exported, as before)
from redcrawl.scrapy.robots_fetch import LOOKUP_BATCH as LOOKUP_BATCH
from redcrawl.scrapy.robots_fetch import POLL as POLL
from redcrawl.settings import Settings

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

__all__ = ["RequestReleased", "RobotsTxtMiddleware", "install", "take_over_from_scrapy"]

log = logging.getLogger(__name__)


class RequestReleased(IgnoreRequest):
    """A request that waited for robots.txt past its start window and was given back to
    the frontier (served again later, no attempt spent): dropped here, not
    acknowledged."""


class RobotsTxtMiddleware(RobotsFetcher):
    """Downloader middleware obeying robots.txt with one download per site for the fleet
    (see the module docstring; the fetching and caching is :class:`RobotsFetcher`'s)."""

    def __init__(self, crawler: Crawler, settings: Settings) -> None:
        if not crawler.settings.getbool("ROBOTSTXT_OBEY"):
            raise NotConfigured
        if one_off_command() is not None:  # Scrapy's own obeys, with no cache in Redis
            raise NotConfigured
        super().__init__(crawler, settings)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> RobotsTxtMiddleware:
        with lifecycle.refusing_config_errors(crawler):
            mw = cls(crawler, Settings.from_scrapy(crawler.settings))
        crawler.signals.connect(mw._spider_opened, signals.spider_opened)
        crawler.signals.connect(mw._spider_closed, signals.spider_closed)
        return mw

    def _spider_opened(self, spider: Any = None) -> None:
        take_over_from_scrapy(self.crawler, self)

    # --- the downloader middleware --------------------------------------------------
    async def process_request(self, request: Request, spider: Any = None) -> None:
        if request.meta.get("dont_obey_robotstxt"):
            return
        if request.url.startswith(("data:", "file:")):
            return
        origin = _origin(request)
        parser = self._known(origin)
        if parser is _MISSING:
            from scrapy.utils.defer import maybe_deferred_to_future

            waiter: Deferred[Any] = Deferred()
            self._waiters.setdefault(origin, []).append(waiter)
            if len(self._waiters[origin]) == 1:
                self._first[origin] = request
                self._resolve([origin])
            waited_from = time.monotonic()
            parser = await maybe_deferred_to_future(waiter)
            self._check(parser, request)
            late = time.monotonic() - waited_from > self.settings.politeness_start_window
            if late or origin in self._pushed:  # (pushed back: the site is blocked now)
                await maybe_deferred_to_future(self._start_after_wait(request))
            return
        self._check(parser, request)

    def _start_after_wait(self, request: Request) -> Deferred[None]:
        """``request`` waited here for robots.txt past its start window, but its site's
        delay was charged when it was granted: ask the frontier whether it may start now
        (its start charged) or must be given back (another start at its site came within
        the delay: the robots.txt download, or a later grant; or the site is blocked:
        its robots.txt answered 429/503). Fires None to go on, or fails with
        :class:`RequestReleased`."""
        scheduler = lifecycle.scheduler_of(self.crawler)
        lease_of = getattr(scheduler, "lease_of", None)
        lease = lease_of(request) if lease_of is not None else None
        frontier = getattr(scheduler, "frontier", None)
        d: Deferred[None] = Deferred()
        if lease is None or frontier is None or getattr(frontier, "politeness", None) is None:
            d.callback(None)
            return d

        def decided(flags: list[bool]) -> None:
            if flags and not flags[0] and scheduler.give_back(request):
                raise RequestReleased("missed its start while waiting for robots.txt")

        def failed(failure: Any) -> Any:
            if failure.check(RequestReleased):
                return failure
            log.warning(
                "redcrawl: could not check the start of %s after its robots.txt wait "
                "(%s); starting it",
                request.url,
                failure.getErrorMessage(),
            )
            return None

        started = self._in_thread(frontier.start_late, [lease])
        started.addCallback(decided)
        started.addErrback(failed)
        return started

    def _check(self, parser: Any, request: Request) -> None:
        if parser is None:
            return
        useragent = self._robotstxt_useragent
        if not useragent:
            useragent = request.headers.get(b"User-Agent", self._default_useragent)
        if not parser.allowed(request.url, useragent):
            log.debug("Forbidden by robots.txt: %s", request)
            self.stats.inc_value("redcrawl/robots/disallowed")
            self.stats.inc_value("robotstxt/forbidden")
            fleet = counters.counters_of(self.crawler)
            if fleet is not None:  # the crawl-wide count, added with the next heartbeat
                fleet.robots_disallowed()
            raise IgnoreRequest("Forbidden by robots.txt")

    def crawl_delay_of(self, url: str) -> float:
        """The Crawl-delay (capped) this worker read in the robots.txt of ``url``'s site,
        0 when none or when its robots.txt is not known here."""
        try:
            origin = _origin(Request(url))
        except ValueError:
            return 0.0
        return self._delays.get(origin, 0.0)


_DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin(request: Request) -> str:
    """What a robots.txt applies to (RFC 9309): scheme, host and port, lower-case, the
    scheme's default port and any user:password@ left out (they would end up in key
    names and logs)."""
    parsed = urlparse_cached(request)
    scheme = parsed.scheme.lower()
    try:
        host, port = parsed.hostname, parsed.port
    except ValueError:  # a bad port: as Scrapy, by the network location
        return f"{scheme}://{parsed.netloc.lower()}"
    if not host:
        return f"{scheme}://{parsed.netloc.lower()}"
    if ":" in host:
        host = f"[{host}]"
    if port is None or port == _DEFAULT_PORTS.get(scheme):
        return f"{scheme}://{host}"
    return f"{scheme}://{host}:{port}"


def _scrapy_version() -> str:
    import scrapy

    return str(scrapy.__version__)


def _manager(crawler: Crawler) -> Any:
    return getattr(getattr(crawler.engine, "downloader", None), "middleware", None)


def take_over_from_scrapy(crawler: Crawler, ours: RobotsTxtMiddleware) -> bool:
    """Take Scrapy's own RobotsTxtMiddleware out of the downloader when ours is enabled
    (both would fetch robots.txt). True when it was there."""
    manager = _manager(crawler)
    if manager is None:
        return False
    theirs = [mw for mw in getattr(manager, "middlewares", ()) if type(mw) is ScrapyRobotsTxt]
    if not theirs:
        return False
    methods = manager.methods["process_request"]
    for i, method in enumerate(list(methods)):
        if getattr(method, "__self__", None) in theirs:
            del methods[i]
            break
    manager.middlewares = tuple(mw for mw in manager.middlewares if mw not in theirs)
    log.info(
        "redcrawl: redcrawl.scrapy.RobotsTxtMiddleware is enabled: Scrapy's "
        "RobotsTxtMiddleware is disabled (both would fetch robots.txt)"
    )
    return True


def install(crawler: Crawler, client: Any, keys: CrawlKeys) -> RobotsTxtMiddleware | None:
    """Called by redcrawl's scheduler at open: with ``ROBOTSTXT_OBEY``, put
    :class:`RobotsTxtMiddleware` at the place of Scrapy's (unless
    ``REDCRAWL_ROBOTS_SHARED`` is off or the project enabled ours), on the scheduler's
    Redis ``client``. Returns the middleware in use, or None."""
    if not crawler.settings.getbool("ROBOTSTXT_OBEY"):
        return None
    manager = _manager(crawler)
    if manager is None:
        return None
    middlewares = tuple(getattr(manager, "middlewares", ()))
    ours = next((mw for mw in middlewares if isinstance(mw, RobotsTxtMiddleware)), None)
    if ours is not None:
        ours.attach(client, keys)
        take_over_from_scrapy(crawler, ours)
        return ours
    if not Settings.from_scrapy(crawler.settings).robots_shared:
        log.info(
            "redcrawl: REDCRAWL_ROBOTS_SHARED is off: robots.txt is fetched by every "
            "worker (Scrapy's RobotsTxtMiddleware)"
        )
        return None
    theirs = next((mw for mw in middlewares if type(mw) is ScrapyRobotsTxt), None)
    if theirs is None:
        custom = [type(mw).__name__ for mw in middlewares if isinstance(mw, ScrapyRobotsTxt)]
        if custom:
            log.warning(
                "redcrawl: %s (a subclass of Scrapy's RobotsTxtMiddleware) is left "
                "as it is: every worker fetches robots.txt itself; use "
                "redcrawl.scrapy.RobotsTxtMiddleware to fetch it once for the fleet",
                custom[0],
            )
        return None
    methods = manager.methods["process_request"]
    index = next((i for i, m in enumerate(methods) if getattr(m, "__self__", None) is theirs), None)
    if index is None:
        log.warning(
            "redcrawl: Scrapy %s: could not put redcrawl.scrapy.RobotsTxtMiddleware "
            "in place of Scrapy's; robots.txt is fetched by every worker (list "
            "redcrawl.scrapy.RobotsTxtMiddleware in DOWNLOADER_MIDDLEWARES)",
            _scrapy_version(),
        )
        return None
    ours = cast(RobotsTxtMiddleware, lifecycle.build_component(RobotsTxtMiddleware, crawler))
    ours.attach(client, keys)
    methods[index] = ours.process_request
    manager.middlewares = tuple(ours if mw is theirs else mw for mw in middlewares)
    log.info(
        "redcrawl: ROBOTSTXT_OBEY: robots.txt is fetched once per site for the fleet "
        "and shared through Redis (redcrawl.scrapy.RobotsTxtMiddleware in place of "
        "Scrapy's RobotsTxtMiddleware; REDCRAWL_ROBOTS_SHARED = False keeps Scrapy's)"
    )
    return ours
