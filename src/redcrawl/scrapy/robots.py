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

Stats: ``redcrawl/robots/fetched`` (downloaded by this worker), ``redcrawl/robots/cached``
(taken from the fleet's cache), ``redcrawl/robots/disallowed``, ``redcrawl/robots/errors``
(5xx or failed downloads), ``redcrawl/robots/crawl_delay_capped``.
"""

from __future__ import annotations

import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar, cast

from scrapy import signals
from scrapy.downloadermiddlewares.robotstxt import RobotsTxtMiddleware as ScrapyRobotsTxt
from scrapy.exceptions import IgnoreRequest, NotConfigured
from scrapy.http import Request
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.misc import load_object
from twisted.internet.defer import Deferred

from redcrawl.keys import CrawlKeys
from redcrawl.politeness.key import KeyMode, politeness_key
from redcrawl.politeness.robots import Lookup, RobotsCache, RobotsEntry
from redcrawl.scrapy import counters, lifecycle
from redcrawl.settings import Settings

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.http import Response

__all__ = ["RequestReleased", "RobotsTxtMiddleware", "install", "take_over_from_scrapy"]

log = logging.getLogger(__name__)

T = TypeVar("T")

POLL = 0.2
"""Seconds between two looks at the cache while another worker fetches a robots.txt."""

LOCAL_MAX = 10_000
"""Parsed robots.txt a worker keeps in memory (least recently used dropped first)."""

LOOKUP_BATCH = 200
"""Origins looked up in one round trip."""

_MISSING = object()


class RequestReleased(IgnoreRequest):
    """A request that waited for robots.txt past its start window and was given back to
    the frontier (served again later, no attempt spent): dropped here, not
    acknowledged."""


class RobotsTxtMiddleware:
    """Downloader middleware obeying robots.txt with one download per site for the fleet
    (see the module docstring)."""

    DOWNLOAD_PRIORITY = 1000

    def __init__(self, crawler: Crawler, settings: Settings) -> None:
        if not crawler.settings.getbool("ROBOTSTXT_OBEY"):
            raise NotConfigured
        self.crawler = crawler
        self.settings = settings
        self.stats = crawler.stats
        self._default_useragent = crawler.settings.get("USER_AGENT")
        self._robotstxt_useragent = crawler.settings.get("ROBOTSTXT_USER_AGENT")
        self._parserimpl = load_object(crawler.settings.get("ROBOTSTXT_PARSER"))
        _build(self._parserimpl, crawler, b"")  # deps are there
        self._cache: RobotsCache | None = None
        self._local: OrderedDict[str, tuple[Any, float]] = OrderedDict()
        self._waiters: dict[str, list[Deferred[Any]]] = {}
        self._remote: set[str] = set()  # another worker fetches these
        self._fetching: set[str] = set()  # we hold their lock and download them
        self._capped: set[str] = set()
        self._first: dict[str, Request] = {}  # the request that first waited, per origin
        self._delays: dict[str, float] = {}  # Crawl-delay of origins in _local, when > 0
        self._executor: ThreadPoolExecutor | None = None
        self._poll_call: Any = None
        self._last_renew = 0.0
        self._closed = False

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> RobotsTxtMiddleware:
        mw = cls(crawler, Settings.from_scrapy(crawler.settings))
        crawler.signals.connect(mw._spider_opened, signals.spider_opened)
        crawler.signals.connect(mw._spider_closed, signals.spider_closed)
        return mw

    # --- wiring ----------------------------------------------------------------------
    def attach(self, client: Any, keys: CrawlKeys) -> None:
        """Use ``client`` and ``keys`` (the scheduler's frontier's) for the cache."""
        if self._cache is None:
            self._cache = RobotsCache(
                client, keys, max_bytes=self._max_bytes(), lock_ttl=self.settings.robots_lock_ttl
            )

    def _max_bytes(self) -> int:
        # one entry of the largest size always fits (else every worker would refetch it)
        return max(self.settings.robots_cache_max_bytes, self.settings.robots_max_body + 4096)

    def _ensure_cache(self) -> RobotsCache:
        """On the thread: without redcrawl's scheduler, a connection of our own."""
        if self._cache is None:
            from redcrawl.connection import connect

            spider = self.crawler.spider
            keys = CrawlKeys(
                self.settings.crawl_name(getattr(spider, "name", None)), self.settings.key_prefix
            )
            self.attach(connect(self.settings), keys)
        assert self._cache is not None
        return self._cache

    def _spider_opened(self, spider: Any = None) -> None:
        take_over_from_scrapy(self.crawler, self)

    def _spider_closed(self, spider: Any = None) -> None:
        self._closed = True
        if self._poll_call is not None and self._poll_call.active():
            self._poll_call.cancel()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    def _in_thread(self, fn: Callable[..., T], *args: Any) -> Deferred[T]:
        """Run ``fn(*args)`` on this middleware's thread; a Deferred fired on the reactor."""
        from twisted.internet import reactor

        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="redcrawl-robots")
        d: Deferred[T] = Deferred()
        call_from_thread = cast(Any, reactor).callFromThread

        def done(future: Any) -> None:
            exc = future.exception()
            if exc is not None:
                call_from_thread(d.errback, exc)
            else:
                call_from_thread(d.callback, future.result())

        self._executor.submit(fn, *args).add_done_callback(done)
        return d

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
            if time.monotonic() - waited_from > self.settings.politeness_start_window:
                await maybe_deferred_to_future(self._start_after_wait(request))
            return
        self._check(parser, request)

    def _start_after_wait(self, request: Request) -> Deferred[None]:
        """``request`` waited here for robots.txt past its start window, but its site's
        delay was charged when it was granted: ask the frontier whether it may start now
        (its start charged) or must be given back (another start at its site came within
        the delay: the robots.txt download, or a later grant). Fires None to go on, or
        fails with :class:`RequestReleased`."""
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

    def _charge_fetch(self, origin: str) -> None:
        """The robots.txt download of ``origin`` is a fetch at its site: its politeness
        key's next grant waits its delay from now (fire and forget)."""
        frontier = self._frontier()
        if frontier is None or getattr(frontier, "politeness", None) is None:
            return
        key = self._key_of(origin)
        self._in_thread(frontier.charge_fetch, [key]).addErrback(
            lambda f: log.debug("redcrawl: robots.txt fetch of %s not charged: %s", origin, f)
        )

    def _frontier(self) -> Any:
        """The frontier of redcrawl's scheduler, or None (another scheduler, or no engine
        yet)."""
        try:
            scheduler = lifecycle.scheduler_of(self.crawler)
        except RuntimeError:  # Scrapy 2.13+: crawler.engine before the crawl starts
            return None
        return getattr(scheduler, "frontier", None)

    def _key_of(self, origin: str) -> str:
        """The politeness key ``origin``'s robots.txt limits (its Crawl-delay) and is
        charged to: the key of the request that first waited for it (its
        ``download_slot``, else its host or, with ``REDCRAWL_POLITENESS_KEY=domain``, its
        registrable domain), in the crawl's key mode (the frontier's, else the
        settings')."""
        mode = getattr(self._frontier(), "politeness", None) or self.settings.politeness_key
        first = self._first.get(origin)
        slot = first.meta.get("download_slot") if first is not None else None
        try:
            return politeness_key(
                first.url if first is not None else f"{origin}/robots.txt",
                slot if isinstance(slot, str) else None,
                cast(KeyMode, mode),
            )
        except ValueError:
            return politeness_key(f"{origin}/robots.txt", mode=cast(KeyMode, mode))

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

    def _known(self, origin: str) -> Any:
        """The parser of ``origin`` this worker holds and that is still fresh (None:
        everything allowed), or ``_MISSING``."""
        found = self._local.get(origin)
        if found is None:
            return _MISSING
        parser, expires = found
        if expires <= time.monotonic():
            del self._local[origin]
            return _MISSING
        self._local.move_to_end(origin)
        return parser

    # --- finding a robots.txt ---------------------------------------------------------
    def _resolve(self, origins: list[str]) -> None:
        """Look ``origins`` up in the fleet's cache (on the thread), then act on each."""
        renew = []
        now = time.monotonic()
        if self._fetching and now - self._last_renew > self.settings.robots_lock_ttl / 3:
            renew, self._last_renew = sorted(self._fetching), now

        def work() -> list[Lookup]:
            cache = self._ensure_cache()
            if renew:
                cache.renew(renew)
            return cache.lookup(origins)

        d = self._in_thread(work)
        d.addCallbacks(self._on_lookups, self._on_lookup_error, errbackArgs=(origins,))

    def _on_lookups(self, lookups: list[Lookup]) -> None:
        for found in lookups:
            origin = found.origin
            if origin not in self._waiters:
                self._remote.discard(origin)
                continue
            if found.state == "cached" and found.entry is not None:
                self._remote.discard(origin)
                self.stats.inc_value("redcrawl/robots/cached")
                self._settle(origin, self._parse(found.entry), found.ms_left / 1000)
            elif found.state == "wait":
                self._remote.add(origin)
            else:  # ours to fetch (or a cached entry this version cannot read)
                self._remote.discard(origin)
                self._fetch(origin, shared=True)
        self._schedule_poll()

    def _on_lookup_error(self, failure: Any, origins: list[str]) -> None:
        """Redis refused or is gone: each worker fetches for itself, not cached."""
        log.warning(
            "redcrawl: robots.txt cache unavailable (%s); fetching robots.txt of %s "
            "in this worker only",
            failure.getErrorMessage(),
            ", ".join(origins[:5]),
        )
        for origin in origins:
            self._remote.discard(origin)
            if origin in self._waiters and origin not in self._fetching:
                self._fetch(origin, shared=False)
        self._schedule_poll()

    def _schedule_poll(self) -> None:
        from twisted.internet import reactor

        if self._closed or not (self._remote or self._fetching):
            return
        if self._poll_call is None or not self._poll_call.active():
            self._poll_call = cast(Any, reactor).callLater(POLL, self._poll)

    def _poll(self) -> None:
        waiting = sorted(self._remote)[:LOOKUP_BATCH]
        if waiting or time.monotonic() - self._last_renew > self.settings.robots_lock_ttl / 3:
            self._resolve(waiting)
        else:
            self._schedule_poll()  # only downloads of our own: nothing to ask Redis yet

    # --- downloading it ---------------------------------------------------------------
    def _fetch(self, origin: str, *, shared: bool) -> None:
        if origin in self._fetching:
            return
        self._fetching.add(origin)
        self._charge_fetch(origin)
        request = Request(
            f"{origin}/robots.txt",
            priority=self.DOWNLOAD_PRIORITY,
            meta={"dont_obey_robotstxt": True},
            callback=_no_callback(),
        )
        d = _engine_download(self.crawler, request)
        d.addCallbacks(
            self._downloaded,
            self._download_failed,
            callbackArgs=(origin, shared),
            errbackArgs=(origin, shared, request),
        )

    def _downloaded(self, response: Response, origin: str, shared: bool) -> None:
        self.stats.inc_value("redcrawl/robots/fetched")
        self.stats.inc_value(f"robotstxt/response_status_count/{response.status}")
        body = response.body[: self.settings.robots_max_body]
        entry = RobotsEntry(response.status, body if 200 <= response.status < 400 else b"")
        self._got(origin, entry, shared)

    def _download_failed(self, failure: Any, origin: str, shared: bool, request: Request) -> None:
        if not failure.check(IgnoreRequest):
            log.error("Error downloading %s: %s", request, failure.getErrorMessage())
            self.stats.inc_value(f"robotstxt/exception_count/{failure.type}")
        self.stats.inc_value("redcrawl/robots/fetched")
        self._got(origin, RobotsEntry(0), shared)

    def _got(self, origin: str, entry: RobotsEntry, shared: bool) -> None:
        parser = self._parse(entry)
        if entry.kind == "error":
            self.stats.inc_value("redcrawl/robots/errors")
            log.info(
                "redcrawl: robots.txt of %s: %s; everything allowed for %s s "
                "(REDCRAWL_ROBOTS_ERROR_TTL)",
                origin,
                f"HTTP {entry.status}" if entry.status else "download failed",
                self.settings.robots_error_ttl,
            )
        ttl = self.settings.robots_error_ttl if entry.kind == "error" else self.settings.robots_ttl
        delay = self._crawl_delay(origin, parser)
        if not shared:
            self._settle(origin, parser, ttl)
            self._fetching.discard(origin)
            return
        key = self._key_of(origin)

        def store() -> Any:
            return self._ensure_cache().store(
                origin, entry, ttl=ttl, politeness_key=key, crawl_delay=delay
            )

        # stored (Crawl-delay in the override) before the waiters ask to start: the
        # thread runs one call at a time, in order
        d = self._in_thread(store)
        d.addCallbacks(
            self._stored, self._store_failed, callbackArgs=(origin, key), errbackArgs=(origin,)
        )
        self._settle(origin, parser, ttl)

    def _stored(self, result: Any, origin: str, key: str) -> None:
        self._fetching.discard(origin)
        if not result.stored:
            log.warning(
                "redcrawl: robots.txt of %s not cached: larger than "
                "REDCRAWL_ROBOTS_CACHE_MAX_BYTES",
                origin,
            )
        if result.override < 0:
            log.warning(
                "redcrawl: the politeness override of %r is not a JSON object; "
                "its Crawl-delay was not set (fix it with `redcrawl hosts`)",
                key,
            )

    def _store_failed(self, failure: Any, origin: str) -> None:
        self._fetching.discard(origin)
        log.warning(
            "redcrawl: could not cache robots.txt of %s for the fleet: %s",
            origin,
            failure.getErrorMessage(),
        )

    # --- what a robots.txt says -------------------------------------------------------
    def _parse(self, entry: RobotsEntry) -> Any:
        """The parser (ROBOTSTXT_PARSER) of ``entry``, or None: everything allowed."""
        if entry.kind != "rules":
            return None
        return _build(self._parserimpl, self.crawler, entry.body)

    def crawl_delay_of(self, url: str) -> float:
        """The Crawl-delay (capped) this worker read in the robots.txt of ``url``'s site,
        0 when none or when its robots.txt is not known here."""
        try:
            origin = _origin(Request(url))
        except ValueError:
            return 0.0
        return self._delays.get(origin, 0.0)

    def _crawl_delay(self, origin: str, parser: Any, *, quiet: bool = False) -> float | None:
        """Crawl-delay for our user agent, capped; None when there is none (or it is
        ignored: ``REDCRAWL_ROBOTS_MAX_CRAWL_DELAY = 0``). ``quiet``: no stat, no log."""
        cap = self.settings.robots_max_crawl_delay
        if parser is None or cap <= 0:
            return None
        useragent = self._robotstxt_useragent or self._default_useragent or "*"
        getter = getattr(parser, "crawl_delay", None) or getattr(
            getattr(parser, "rp", None), "crawl_delay", None
        )
        if getter is None:
            return None
        try:
            value = getter(useragent)
        except Exception:  # a third-party parser: Crawl-delay is a bonus, not a failure
            log.debug("redcrawl: could not read Crawl-delay of %s", origin, exc_info=True)
            return None
        if value is None:
            return None
        try:
            delay = float(value)
        except (TypeError, ValueError):
            return None
        if not math.isfinite(delay) or delay <= 0:
            return None
        if delay > cap and quiet:
            delay = cap
        elif delay > cap:
            self.stats.inc_value("redcrawl/robots/crawl_delay_capped")
            if origin not in self._capped:
                self._capped.add(origin)
                log.warning(
                    "redcrawl: %s asks for Crawl-delay %s s; keeping %s s "
                    "(REDCRAWL_ROBOTS_MAX_CRAWL_DELAY)",
                    origin,
                    f"{delay:g}",
                    f"{cap:g}",
                )
            delay = cap
        return delay

    def _settle(self, origin: str, parser: Any, ttl: float) -> None:
        """Remember ``origin``'s parser for ``ttl`` seconds and check every request
        waiting for it (each has its own Deferred)."""
        self._local[origin] = (parser, time.monotonic() + ttl)
        self._local.move_to_end(origin)
        delay = self._crawl_delay(origin, parser, quiet=True)
        if delay:
            self._delays[origin] = delay
        else:
            self._delays.pop(origin, None)
        while len(self._local) > LOCAL_MAX:
            dropped, _ = self._local.popitem(last=False)
            self._delays.pop(dropped, None)
        first = self._first.pop(origin, None)
        if parser is not None and first is not None:  # as Scrapy's middleware
            self.crawler.signals.send_catch_log(
                signal=signals.robots_parsed, robotparser=parser, request=first
            )
        for waiter in self._waiters.pop(origin, []):
            waiter.callback(parser)


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


def _build(cls: Any, crawler: Crawler, *args: Any) -> Any:
    """Scrapy's way to build a component with extra arguments (2.12+ and before)."""
    try:
        from scrapy.utils.misc import build_from_crawler
    except ImportError:  # Scrapy < 2.12
        from scrapy.utils.misc import create_instance  # type: ignore[attr-defined]

        return create_instance(cls, crawler.settings, crawler, *args)
    return build_from_crawler(cls, crawler, *args)


def _scrapy_version() -> str:
    import scrapy

    return str(scrapy.__version__)


def _no_callback() -> Any:
    try:
        from scrapy.http.request import NO_CALLBACK
    except ImportError:  # Scrapy < 2.8
        return None
    return NO_CALLBACK


def _engine_download(crawler: Crawler, request: Request) -> Deferred[Any]:
    """The engine downloads ``request`` (downloader middlewares only, no scheduler)."""
    engine: Any = crawler.engine
    download_async = getattr(engine, "download_async", None)
    if download_async is not None:  # Scrapy 2.14+
        from scrapy.utils.defer import deferred_from_coro

        return cast("Deferred[Any]", deferred_from_coro(download_async(request)))
    return cast("Deferred[Any]", engine.download(request))


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
