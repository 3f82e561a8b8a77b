"""AutoThrottle for the fleet: ``redcrawl.scrapy.AutoThrottle``.

A Scrapy extension used in place of Scrapy's ``scrapy.extensions.throttle.AutoThrottle``
when ``AUTOTHROTTLE_ENABLED`` is on and redcrawl's scheduler runs a crawl with fleet-wide
politeness (the scheduler installs it by itself at open, :func:`install`;
``REDCRAWL_AUTOTHROTTLE_SHARED = False`` keeps Scrapy's).

* **One delay per site for the fleet.** Each response's ``download_latency`` goes, with the
  request's politeness key and status, to Redis, where Scrapy's update rule is applied to
  the key's fleet-wide delay (:class:`redcrawl.politeness.autothrottle.FleetThrottle`:
  the field ``ad`` of the key's state hash, which expires with the key's other state
  an hour after the site goes idle; on a partitioned crawl, in the key's partition);
  the frontier spaces the key's grants by it, for all workers. The worker's own
  downloader adds no delay (the scheduler zeroes it).
* **Same rule, same settings:** ``AUTOTHROTTLE_TARGET_CONCURRENCY``, ``_START_DELAY``,
  ``_MAX_DELAY``, ``_DEBUG``, ``DOWNLOAD_DELAY`` as the smallest delay; a response other
  than 200 never lowers the delay; download errors (no response) change nothing; a request
  with ``meta["autothrottle_dont_adjust_delay"] = True`` is not counted.
* **Never on the reactor:** responses are queued and sent from a thread of this
  extension's own, in one script call for everything queued meanwhile (so one Redis call
  per response at low rates, fewer under load). Redis errors are logged (at most every
  :data:`WARN_EVERY` seconds) and counted; the fleet keeps its last delays.

Stats: ``redcrawl/autothrottle/responses`` (latencies sent), ``redcrawl/autothrottle/calls``
(script calls), ``redcrawl/autothrottle/errors``.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, cast

from scrapy import signals
from scrapy.exceptions import NotConfigured
from scrapy.extensions.throttle import AutoThrottle as ScrapyAutoThrottle
from scrapy.utils.httpobj import urlparse_cached

from redcrawl.errors import RedcrawlError
from redcrawl.keys import CrawlKeys
from redcrawl.politeness.autothrottle import Applied, FleetThrottle, ThrottleRule, Update
from redcrawl.politeness.key import KeyMode, politeness_key
from redcrawl.scrapy import lifecycle
from redcrawl.settings import Settings

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.http import Request, Response

__all__ = ["AutoThrottle", "install", "request_key"]

log = logging.getLogger(__name__)

WARN_EVERY = 30.0
"""Seconds between two warnings about failed AutoThrottle updates."""

SCRAPY_PATH = "scrapy.extensions.throttle.AutoThrottle"


def request_key(request: Request, mode: KeyMode, ip_slot: str | None = None) -> str:
    """The politeness key the frontier stored for ``request`` (when it was pushed), from the
    request as its response comes back.

    Scrapy's downloader writes its slot key into ``meta["download_slot"]`` (the host name,
    or its IP address with ``CONCURRENT_REQUESTS_PER_IP``: ``ip_slot``); a value other
    than those was the spider's own, which the frontier took verbatim. (Limit: a spider
    that sets ``download_slot`` to the request's own host name, in ``domain`` mode, has
    its latencies counted against the domain.)"""
    slot = request.meta.get("download_slot")
    host = urlparse_cached(request).hostname or ""
    if slot is not None and (slot == host or (ip_slot is not None and slot == ip_slot)):
        slot = None
    return politeness_key(request.url, slot, mode)


class AutoThrottle:
    """Scrapy's AutoThrottle on fleet-wide state (see the module docstring)."""

    def __init__(self, crawler: Crawler, settings: Settings) -> None:
        if not settings.autothrottle_enabled:
            raise NotConfigured
        if settings.autothrottle_target_concurrency <= 0:
            raise NotConfigured(
                f"AUTOTHROTTLE_TARGET_CONCURRENCY "
                f"({settings.autothrottle_target_concurrency!r}) must be higher than 0."
            )
        self.crawler = crawler
        self.stats = crawler.stats
        self.debug = settings.autothrottle_debug
        self.rule = ThrottleRule.from_settings(settings)
        self._ip = bool(settings.politeness_concurrency_per_ip)
        self.fleet: FleetThrottle | None = None
        self._mode: KeyMode = "host"
        self._lock = threading.Lock()
        self._pending: list[tuple[Update, int]] = []  # (update, body size)
        self._sending = False
        self._executor: ThreadPoolExecutor | None = None
        self._last_warning = 0.0
        self._closed = False

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> AutoThrottle:
        with lifecycle.refusing_config_errors(crawler):
            ext = cls(crawler, Settings.from_scrapy(crawler.settings))
        crawler.signals.connect(ext._spider_opened, signals.spider_opened)
        crawler.signals.connect(ext._response_downloaded, signals.response_downloaded)
        crawler.signals.connect(ext._spider_closed, signals.spider_closed)
        return ext

    # --- wiring ----------------------------------------------------------------------
    def attach(
        self, client: Any, keys: CrawlKeys, mode: str, *, partitions: int | None = None
    ) -> FleetThrottle:
        """Keep the fleet's state on ``client`` (the scheduler's) for the crawl of ``keys``
        (of ``partitions`` partitions; None: read from the crawl), whose politeness keys
        are in ``mode``; switch it on for the lease step."""
        self._mode = cast(KeyMode, mode)
        self.fleet = FleetThrottle(client, keys, self.rule, partitions=partitions)
        self.fleet.enable()
        return self.fleet

    def _spider_opened(self, spider: Any = None) -> None:
        if self.fleet is None:
            log.warning(
                "redcrawl: redcrawl.scrapy.AutoThrottle throttles nothing here: it needs "
                "redcrawl's scheduler on a crawl with fleet-wide politeness (Scrapy's "
                "AutoThrottle, if enabled, stays on)"
            )
            return
        take_over_from_scrapy(self.crawler, self)

    def _spider_closed(self, spider: Any = None) -> None:
        self._closed = True
        if self._executor is not None:
            self._executor.shutdown(wait=False)  # what is queued is still sent

    # --- responses (reactor thread) ---------------------------------------------------
    def _response_downloaded(self, response: Response, request: Request, spider: Any) -> None:
        if self.fleet is None:
            return
        latency = request.meta.get("download_latency")
        if latency is None or request.meta.get("autothrottle_dont_adjust_delay", False) is True:
            return
        try:
            key = request_key(request, self._mode, self._ip_slot(request))
        except (ValueError, TypeError):
            return  # the frontier refused such a request at push: not one of ours
        self.stats.inc_value("redcrawl/autothrottle/responses")
        with self._lock:
            self._pending.append((Update(key, float(latency), response.status), len(response.body)))
            if self._sending or self._closed:
                return
            self._sending = True
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="redcrawl-autothrottle")
        self._executor.submit(self._send)

    def _ip_slot(self, request: Request) -> str | None:
        if not self._ip:
            return None
        from scrapy.resolver import dnscache

        host = urlparse_cached(request).hostname or ""
        return cast(str | None, dnscache.get(host))

    # --- the extension's thread -------------------------------------------------------
    def _send(self) -> None:
        """Send everything queued, until the queue stays empty."""
        assert self.fleet is not None
        while True:
            with self._lock:
                batch, self._pending = self._pending, []
                if not batch:
                    self._sending = False
                    return
            try:
                applied = self.fleet.update([u for u, _ in batch])
            except RedcrawlError as exc:
                self.stats.inc_value("redcrawl/autothrottle/errors")
                now = time.monotonic()
                if now - self._last_warning >= WARN_EVERY:
                    self._last_warning = now
                    log.warning(
                        "redcrawl: AutoThrottle could not update the fleet's delays "
                        "(%s); the sites keep their last delays until Redis answers",
                        exc,
                    )
                continue
            self.stats.inc_value("redcrawl/autothrottle/calls")
            if self.debug:
                for (update, size), result in zip(batch, applied, strict=True):
                    self._log_debug(update, size, result)

    def _log_debug(self, update: Update, size: int, result: Applied) -> None:
        if result.old is None or result.new is None:
            return
        log.info(
            "slot: %(slot)s | delay:%(delay)5d ms (%(delaydiff)+d) | "
            "latency:%(latency)5d ms | size:%(size)6d bytes (fleet-wide)",
            {
                "slot": update.key,
                "delay": result.new * 1000,
                "delaydiff": (result.new - result.old) * 1000,
                "latency": update.latency * 1000,
                "size": size,
            },
        )


def _signal_handlers(ext: Any) -> list[tuple[Any, Any]]:
    """Scrapy's AutoThrottle's (handler, signal) pairs (Scrapy 2.11-2.19)."""
    pairs = [
        ("_spider_opened", signals.spider_opened),
        ("_response_downloaded", signals.response_downloaded),
    ]
    return [(getattr(ext, name), sig) for name, sig in pairs if hasattr(ext, name)]


def take_over_from_scrapy(crawler: Crawler, ours: AutoThrottle) -> None:
    """Switch Scrapy's own AutoThrottle off (its signal handlers disconnected, out of the
    extension list), if it runs next to ``ours``: it would put per-process delays back into
    the worker's downloader."""
    manager = getattr(crawler, "extensions", None)
    if manager is None:
        return
    exts = tuple(getattr(manager, "middlewares", ()))
    theirs = [e for e in exts if type(e) is ScrapyAutoThrottle]
    for ext in theirs:
        for handler, sig in _signal_handlers(ext):
            crawler.signals.disconnect(handler, signal=sig)
    if theirs or ours not in exts:
        manager.middlewares = (*(e for e in exts if e not in theirs and e is not ours), ours)


def _disabled_in_extensions(crawler: Crawler) -> bool:
    get = getattr(crawler.settings, "getwithbase", None)
    extensions = get("EXTENSIONS") if get is not None else {}
    for name, order in dict(extensions).items():
        path = name if isinstance(name, str) else f"{name.__module__}.{name.__qualname__}"
        if path == SCRAPY_PATH and order is None:
            return True
    return False


def install(crawler: Crawler, frontier: Any) -> AutoThrottle | None:
    """Called by redcrawl's scheduler at open: with ``AUTOTHROTTLE_ENABLED`` on a crawl with
    fleet-wide politeness, put :class:`AutoThrottle` in place of Scrapy's (unless
    ``REDCRAWL_AUTOTHROTTLE_SHARED`` is off, Scrapy's is disabled or subclassed, or the
    project enabled ours), on the ``frontier``'s Redis client. Otherwise the fleet's
    AutoThrottle is switched off for the lease step. Returns the extension, or None."""
    mode = getattr(frontier, "politeness", None)
    if mode is None:
        return None  # no fleet-wide politeness: Scrapy's AutoThrottle, per process
    settings = Settings.from_scrapy(crawler.settings)
    ours = _install(crawler, frontier, settings)
    if ours is None:
        fleet = FleetThrottle(
            frontier.client,
            frontier.keys,
            ThrottleRule(1.0, 0.0, 0.0, 0.0),
            partitions=_partitions(frontier),
        )
        if fleet.disable():
            log.info(
                "redcrawl: fleet-wide AutoThrottle switched off for crawl %r (this worker "
                "runs without it); the sites' auto_delay values are ignored",
                frontier.crawl,
            )
    return ours


def _partitions(frontier: Any) -> int:
    """The partitions of ``frontier``'s crawl (a partitioned frontier's ``n``)."""
    n = getattr(frontier, "n", 1)
    return n if isinstance(n, int) and n > 1 else 1


def _install(crawler: Crawler, frontier: Any, settings: Settings) -> AutoThrottle | None:
    if not settings.autothrottle_enabled or settings.autothrottle_target_concurrency <= 0:
        return None
    manager = getattr(crawler, "extensions", None)
    exts = tuple(getattr(manager, "middlewares", ()))
    ours = next((e for e in exts if isinstance(e, AutoThrottle)), None)
    if ours is None:
        if not settings.autothrottle_shared:
            log.info(
                "redcrawl: REDCRAWL_AUTOTHROTTLE_SHARED is off: every worker throttles "
                "itself (Scrapy's AutoThrottle)"
            )
            return None
        custom = [
            type(e).__name__
            for e in exts
            if isinstance(e, ScrapyAutoThrottle) and type(e) is not ScrapyAutoThrottle
        ]
        if custom:
            log.warning(
                "redcrawl: %s (a subclass of Scrapy's AutoThrottle) is left as it is: "
                "every worker throttles itself; use redcrawl.scrapy.AutoThrottle for one "
                "delay per site for the fleet",
                custom[0],
            )
            return None
        if _disabled_in_extensions(crawler):
            log.warning(
                "redcrawl: AUTOTHROTTLE_ENABLED is on but EXTENSIONS disables %s: no "
                "AutoThrottle (neither Scrapy's nor the fleet's)",
                SCRAPY_PATH,
            )
            return None
        ours = cast(AutoThrottle, lifecycle.build_component(AutoThrottle, crawler))
    ours.attach(
        frontier.client, frontier.keys, frontier.politeness, partitions=_partitions(frontier)
    )
    take_over_from_scrapy(crawler, ours)
    r = ours.rule
    log.info(
        "redcrawl: AUTOTHROTTLE_ENABLED: one delay per site for the whole fleet, adjusted "
        "from every worker's latencies in Redis and kept by the frontier (target "
        "concurrency %g for all workers together, start delay %gs, delay between %gs and "
        "%gs; redcrawl.scrapy.AutoThrottle in place of Scrapy's AutoThrottle; "
        "REDCRAWL_AUTOTHROTTLE_SHARED = False keeps Scrapy's)",
        r.target_concurrency,
        r.start_delay,
        r.min_delay,
        r.max_delay,
    )
    return ours
