"""A worker's counters, added to the crawl's state in Redis with each heartbeat.

:class:`WorkerCounters` counts from Scrapy's signals (on the reactor thread) and hands
what it counted since the last heartbeat to :meth:`FrontierCore.renew_counting` (on the
worker's I/O thread), which adds it in the same round trip as the heartbeat. Nothing
needs to scrape the worker: a worker that dies leaves its totals behind in the crawl.

What goes where (docs/metrics.md):

=====================  =================================================================
the crawl's stats hash  fleet totals, fields ``pages``, ``bytes``, ``err:<kind>``,
(``CrawlKeys.stats``)   ``dl:<bound ms>`` / ``dl:inf`` / ``dl_sum`` (download latency
                        histogram, ms, non-cumulative), ``stored:inserted`` /
                        ``stored:updated`` (:class:`~redcrawl.scrapy.pipelines.UpsertPipeline`),
                        ``robots_disallowed`` (requests robots.txt disallowed,
                        :class:`~redcrawl.scrapy.robots.RobotsTxtMiddleware`)
the worker's hash       ``pages``, ``ok``, ``failed``, ``bytes``, ``items`` (this worker's
(``CrawlKeys.           totals), ``pages_per_s`` and ``success`` (over its last heartbeat
worker_counters``)      interval); expires with the worker's heartbeat deadline
=====================  =================================================================

Error kinds (bounded by construction): ``download`` (a download attempt ended with an
exception: Scrapy's ``downloader/exception_count``, retried attempts included),
``http_4xx``, ``http_5xx`` (responses that reached the spider), ``callback`` (the
callback raised), ``item`` (an item pipeline raised).

A page is a response that reached the engine; it succeeded if its status is below 400
and its callback did not raise. ``success`` = succeeded / (pages + download errors).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from scrapy import signals

from redcrawl.metrics.buckets import DOWNLOAD_BOUNDS_MS, ERROR_KINDS

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

    from redcrawl.frontier import FrontierCore

__all__ = ["DOWNLOAD_BOUNDS_MS", "ERROR_KINDS", "WorkerCounters", "counters_of", "install"]


def _bucket(ms: float) -> str:
    for b in DOWNLOAD_BOUNDS_MS:
        if ms <= b:
            return f"dl:{b}"
    return "dl:inf"


class WorkerCounters:
    """Thread-safe counters of one worker; see the module docstring.

    :meth:`take` returns (fleet totals to add, this worker's totals to add, this worker's
    gauges to set) and starts a new interval; :meth:`give_back` puts a take back when the
    heartbeat failed."""

    def __init__(
        self,
        *,
        exceptions: Callable[[], int] = lambda: 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._lock = threading.Lock()
        self._exceptions = exceptions
        self._seen_exceptions = exceptions()
        self._clock = clock
        self._since = clock()
        self._totals: dict[str, int] = {}
        self._mine: dict[str, int] = {}

    def _add(self, totals: dict[str, int], mine: dict[str, int]) -> None:
        with self._lock:
            for k, v in totals.items():
                self._totals[k] = self._totals.get(k, 0) + v
            for k, v in mine.items():
                self._mine[k] = self._mine.get(k, 0) + v

    # --- what the signals report (reactor thread) --------------------------------------
    def response(self, status: int, size: int, latency: float | None) -> None:
        totals = {"pages": 1, "bytes": size}
        mine = {"pages": 1, "bytes": size, "ok": 1}
        if latency is not None and latency >= 0:
            ms = int(latency * 1000)
            totals[_bucket(ms)] = 1
            totals["dl_sum"] = ms
        if status >= 400:
            totals["err:http_5xx" if status >= 500 else "err:http_4xx"] = 1
            mine["ok"] = 0
            mine["failed"] = 1
        self._add(totals, mine)

    def callback_error(self, had_ok_response: bool) -> None:
        self._add({"err:callback": 1}, {"ok": -1 if had_ok_response else 0, "failed": 1})

    def item(self) -> None:
        self._add({}, {"items": 1})

    def item_error(self) -> None:
        self._add({"err:item": 1}, {})

    def robots_disallowed(self) -> None:
        """robots.txt disallowed a request: finished (DONE) without a fetch."""
        self._add({"robots_disallowed": 1}, {})

    def stored(self, inserted: bool) -> None:
        """UpsertPipeline stored an item: a new key (inserted) or a duplicate (updated)."""
        self._add({"stored:inserted" if inserted else "stored:updated": 1}, {})

    # --- the heartbeat's side (I/O thread) -----------------------------------------------
    def take(self) -> tuple[dict[str, int], dict[str, int], dict[str, str]]:
        now = self._clock()
        exc = self._exceptions()
        with self._lock:
            totals, mine = self._totals, self._mine
            self._totals, self._mine = {}, {}
            elapsed, self._since = max(now - self._since, 1e-3), now
            failed_dl, self._seen_exceptions = max(exc - self._seen_exceptions, 0), exc
        if failed_dl:
            totals["err:download"] = totals.get("err:download", 0) + failed_dl
            mine["failed"] = mine.get("failed", 0) + failed_dl
        pages, ok = mine.get("pages", 0), max(mine.get("ok", 0), 0)
        tried = pages + failed_dl
        gauges = {"pages_per_s": f"{pages / elapsed:.3f}"}
        if tried:
            gauges["success"] = f"{ok / tried:.4f}"
        return (
            {k: v for k, v in totals.items() if v},
            {k: v for k, v in mine.items() if v},
            gauges,
        )

    def give_back(self, totals: dict[str, int], mine: dict[str, int]) -> None:
        """A heartbeat that failed: its counts go with the next one."""
        self._add(totals, mine)


_INSTALLED: weakref.WeakKeyDictionary[Any, WorkerCounters] = weakref.WeakKeyDictionary()


def install(crawler: Crawler, frontier: FrontierCore) -> WorkerCounters:
    """Count this worker's pages, errors, bytes, download latencies and items from
    ``crawler``'s signals, and have ``frontier``'s heartbeat (:meth:`FrontierCore.renew`)
    add them to the crawl."""
    stats = crawler.stats

    def exceptions() -> int:
        return int(stats.get_value("downloader/exception_count", 0) or 0) if stats else 0

    counters = WorkerCounters(exceptions=exceptions)

    def on_response(response: Any, request: Any, spider: Any) -> None:
        latency = request.meta.get("download_latency") if request is not None else None
        counters.response(
            int(response.status),
            len(response.body or b""),
            latency if isinstance(latency, (int, float)) else None,
        )

    def on_spider_error(failure: Any, response: Any, spider: Any) -> None:
        counters.callback_error(getattr(response, "status", 500) < 400)

    def on_item(item: Any, response: Any, spider: Any) -> None:
        counters.item()

    def on_item_error(item: Any, response: Any, spider: Any, failure: Any) -> None:
        counters.item_error()

    crawler.signals.connect(on_response, signals.response_received, weak=False)
    crawler.signals.connect(on_spider_error, signals.spider_error, weak=False)
    crawler.signals.connect(on_item, signals.item_scraped, weak=False)
    crawler.signals.connect(on_item_error, signals.item_error, weak=False)
    frontier.heartbeat_counters = counters
    _INSTALLED[crawler] = counters
    return counters


def counters_of(crawler: Crawler | None) -> WorkerCounters | None:
    """The counters :func:`install` set up for ``crawler`` (by redcrawl's scheduler), or
    None (another scheduler: nothing goes to Redis)."""
    return _INSTALLED.get(crawler) if crawler is not None else None
