"""Finding an origin's robots.txt once for the fleet (the machinery under
:class:`redcrawl.scrapy.RobotsTxtMiddleware`, :mod:`redcrawl.scrapy.robots`).

:class:`RobotsFetcher` keeps the parsed robots.txt this worker knows (least recently used
dropped first), looks the others up in the crawl's cache in Redis
(:class:`redcrawl.politeness.robots.RobotsCache`) from a thread of its own, takes an
origin's lock and downloads it through the engine on a miss, or polls the cache every
:data:`POLL` seconds while another worker does; it stores what it downloaded (with the
Crawl-delay in the host's politeness override), charges the download to the host's
politeness key, and hands the parser to every request that waited for it.
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
from scrapy.exceptions import IgnoreRequest
from scrapy.http import Request
from scrapy.utils.misc import load_object
from twisted.internet.defer import Deferred

from redcrawl.keys import CrawlKeys
from redcrawl.politeness.backoff import parse_retry_after
from redcrawl.politeness.key import KeyMode, politeness_key
from redcrawl.politeness.robots import Lookup, RobotsCache, RobotsEntry
from redcrawl.scrapy import lifecycle
from redcrawl.settings import Settings

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.http import Response

__all__ = ["LOCAL_MAX", "LOOKUP_BATCH", "POLL", "RobotsFetcher"]

log = logging.getLogger("redcrawl.scrapy.robots")  # the middleware's logger, as before

T = TypeVar("T")

POLL = 0.2
"""Seconds between two looks at the cache while another worker fetches a robots.txt."""

LOCAL_MAX = 10_000
"""Parsed robots.txt a worker keeps in memory (least recently used dropped first)."""

LOOKUP_BATCH = 200
"""Origins looked up in one round trip."""

_MISSING = object()


class RobotsFetcher:
    """The parsed robots.txt of each origin, fetched once for the fleet (see the module
    docstring); :class:`~redcrawl.scrapy.robots.RobotsTxtMiddleware` checks requests
    against them."""

    DOWNLOAD_PRIORITY = 1000

    def __init__(self, crawler: Crawler, settings: Settings) -> None:
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
        # origins whose robots.txt answered 429/503 here: their waiters ask before they start
        self._pushed: set[str] = set()
        self._capped: set[str] = set()
        self._first: dict[str, Request] = {}  # the request that first waited, per origin
        self._delays: dict[str, float] = {}  # Crawl-delay of origins in _local, when > 0
        self._executor: ThreadPoolExecutor | None = None
        self._poll_call: Any = None
        self._last_renew = 0.0
        self._closed = False

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

    # --- the politeness key of a robots.txt download ------------------------------------
    def _charge_fetch(self, origin: str) -> bool:
        """The robots.txt download of ``origin`` is a fetch at its site: its politeness
        key's next grant waits its delay from now (fire and forget). Whether the crawl
        has fleet-wide politeness."""
        frontier = self._frontier()
        if frontier is None or getattr(frontier, "politeness", None) is None:
            return False
        key = self._key_of(origin)
        self._in_thread(frontier.charge_fetch, [key]).addErrback(
            lambda f: log.debug("redcrawl: robots.txt fetch of %s not charged: %s", origin, f)
        )
        return True

    def _pushed_back(self, origin: str, response: Response) -> None:
        """The site answered its robots.txt with a status of REDCRAWL_DEFER_HTTP_CODES
        (429/503): its key is blocked for the fleet (its Retry-After, else the backoff),
        as a deferral of one of its pages would block it (fire and forget)."""
        frontier = self._frontier()
        if frontier is None or getattr(frontier, "politeness", None) is None:
            return
        found = parse_retry_after(
            response.headers.get(b"Retry-After"), time.time(), cap=self.settings.retry_after_cap
        )
        self.stats.inc_value(f"redcrawl/robots/deferred_{response.status}")
        if len(self._pushed) >= 10_000:
            self._pushed.clear()  # (a hint for the waiters of the moment: no history kept)
        self._pushed.add(origin)
        self._in_thread(
            frontier.block_site, self._key_of(origin), None if found is None else found.delay
        ).addErrback(lambda f: log.debug("redcrawl: the site of %s not blocked: %s", origin, f))

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
        polite = self._charge_fetch(origin)
        request = Request(
            f"{origin}/robots.txt",
            priority=self.DOWNLOAD_PRIORITY,
            # with fleet-wide politeness Scrapy's immediate retries are not spaced (a
            # robots.txt is not a request the worker holds): a failure is cached for
            # REDCRAWL_ROBOTS_ERROR_TTL and fetched again after it instead
            meta={"dont_obey_robotstxt": True, "dont_retry": polite},
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
        if response.status in self.settings.defer_http_codes:
            self._pushed_back(origin, response)
        else:
            self._pushed.discard(origin)
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


def _build(cls: Any, crawler: Crawler, *args: Any) -> Any:
    """Scrapy's way to build a component with extra arguments (2.12+ and before)."""
    try:
        from scrapy.utils.misc import build_from_crawler
    except ImportError:  # Scrapy < 2.12
        from scrapy.utils.misc import create_instance  # type: ignore[attr-defined]

        return create_instance(cls, crawler.settings, crawler, *args)
    return build_from_crawler(cls, crawler, *args)


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
