"""The spider of ``bench/bench_crawl.py``: follow every link of the local shop site.

Run by the benchmark as ``scrapy runspider bench/crawl_spider.py -a url=... -a
stats_file=...`` with the scheduler under test in ``-s`` settings. It follows every
``a::attr(href)`` with ``response.follow`` and yields nothing else, so the worker's time
goes to Scrapy (download, parse, link extraction, fingerprints) and to the scheduler.

It times itself with signals, so process start-up is never counted: the wall-clock time
(``time.time()``, comparable across processes on one machine) of the first and of the
last ``response_received``, of the first ``spider_idle`` after the first response, and of
``spider_closed``; the process CPU time over the same window. On ``spider_closed`` it
writes those, the response count and the crawler's stats (the scheduler's included) to
the JSON file named by the spider argument ``stats_file``.

Spider arguments:

``url``
    The site's base URL (``http://127.0.0.1:PORT``); the crawl starts at ``url + "/"``.
``stats_file``
    Where to write the JSON report (nothing is written without it).
``idle_grace``
    Seconds (default 0). When above 0, an idle spider stays open until it has seen no
    response and no queued request for that long, asking its scheduler again every 50 ms.
    ``bench_crawl.py`` sets it for scrapy-redis fleets only: scrapy-redis's scheduler
    knows nothing of requests in flight at other workers, so a worker that finds the
    shared queue momentarily empty (at start-up, before the other worker has pushed the
    home page's links) would close at once. redcrawl keeps its workers open by itself
    (global ready + delayed + in flight), and a lone worker needs no grace.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any, cast

import scrapy
from scrapy import signals
from scrapy.exceptions import DontCloseSpider
from scrapy.http import Response

IMPORTED_AT = time.time()
"""About when the worker process started (the spider module is imported early)."""

POLL = 0.05
"""Seconds between scheduler polls while an idle spider is kept open (idle_grace)."""


class CrawlBenchSpider(scrapy.Spider):
    name = "crawlbench"
    custom_settings = {
        # The same for every contender; bench_crawl.py passes them with -s as well.
        "CONCURRENT_REQUESTS": 16,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 16,
        "LOG_LEVEL": "WARNING",
        "TELNETCONSOLE_ENABLED": False,
        "AUTOTHROTTLE_ENABLED": False,
        "ROBOTSTXT_OBEY": False,
        "COOKIES_ENABLED": False,
        "RETRY_ENABLED": False,
    }

    def __init__(
        self,
        url: str = "http://127.0.0.1:8000",
        stats_file: str | None = None,
        idle_grace: str | float = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.base_url = url.rstrip("/")
        self.stats_file = stats_file
        self.idle_grace = float(idle_grace)
        self.opened_at = 0.0
        self.responses = 0
        self.first_response: float | None = None
        self.last_response: float | None = None
        self.first_idle: float | None = None
        self.cpu_at_first: float | None = None
        self.cpu_at_last: float | None = None
        self.times_at_first: os.times_result | None = None
        self.times_at_last: os.times_result | None = None
        self.last_busy = 0.0
        self.response_times: list[float] = []
        self.grace_polls = 0
        self._poll_call: Any = None

    @classmethod
    def from_crawler(cls, crawler: Any, *args: Any, **kwargs: Any) -> CrawlBenchSpider:
        spider = super().from_crawler(crawler, *args, **kwargs)
        crawler.signals.connect(spider._on_opened, signals.spider_opened)
        crawler.signals.connect(spider._on_response, signals.response_received)
        crawler.signals.connect(spider._on_idle, signals.spider_idle)
        crawler.signals.connect(spider._on_closed, signals.spider_closed)
        return spider

    async def start(self) -> AsyncIterator[Any]:
        # dont_filter=False: with a shared frontier, every worker yields the same start
        # URL and only one of them may fetch it.
        yield scrapy.Request(self.base_url + "/", callback=self.parse, dont_filter=False)

    def parse(self, response: Response) -> Iterator[scrapy.Request]:
        for href in response.css("a::attr(href)").getall():
            yield response.follow(href, callback=self.parse)

    # --- timing --------------------------------------------------------------------------
    def _on_opened(self, spider: Any) -> None:
        self.opened_at = self.last_busy = time.time()

    def _on_response(self, response: Response, request: Any, spider: Any) -> None:
        now = time.time()
        cpu = time.process_time()
        times = os.times()
        if self.first_response is None:
            self.first_response, self.cpu_at_first, self.times_at_first = now, cpu, times
        self.last_response, self.cpu_at_last, self.times_at_last = now, cpu, times
        self.last_busy = now
        self.responses += 1
        self.response_times.append(now)

    def _on_idle(self, spider: Any) -> None:
        now = time.time()
        if self.first_idle is None and self.first_response is not None:
            self.first_idle = now
        if self.idle_grace <= 0:
            return
        engine = self.crawler.engine
        slot = getattr(engine, "_slot", None) or getattr(engine, "slot", None)
        scheduler = getattr(slot, "scheduler", None)
        if scheduler is not None and scheduler.has_pending_requests():
            self.last_busy = now
        if now - self.last_busy < self.idle_grace:
            self.grace_polls += 1
            self._wake_soon(slot)
            raise DontCloseSpider

    def _wake_soon(self, slot: Any) -> None:
        """Ask the engine for requests again in POLL seconds (not at its 5 s heartbeat)."""
        from twisted.internet import reactor

        if slot is None or (self._poll_call is not None and self._poll_call.active()):
            return

        def wake() -> None:
            if getattr(slot, "closing", None) is None:
                slot.nextcall.schedule()

        self._poll_call = cast(Any, reactor).callLater(POLL, wake)

    def _on_closed(self, spider: Any, reason: str) -> None:
        closed = time.time()
        cpu = time.process_time()
        if self._poll_call is not None and self._poll_call.active():
            self._poll_call.cancel()
        if not self.stats_file:
            return
        stats = self.crawler.stats.get_stats() if self.crawler.stats else {}
        first, last = self.first_response, self.last_response
        report = {
            "pid": os.getpid(),
            "reason": reason,
            "imported_at": IMPORTED_AT,
            "opened_at": self.opened_at,
            "first_response": first,
            "last_response": last,
            "first_idle": self.first_idle,
            "closed_at": closed,
            "responses": self.responses,
            "response_received_count": int(stats.get("response_received_count", 0)),
            "elapsed": (last - first) if first is not None and last is not None else 0.0,
            "elapsed_to_close": (closed - first) if first is not None else 0.0,
            "cpu_window": ((self.cpu_at_last or 0.0) - (self.cpu_at_first or 0.0)),
            "cpu_user_window": _delta(self.times_at_first, self.times_at_last, 0),
            "cpu_sys_window": _delta(self.times_at_first, self.times_at_last, 1),
            "cpu_total": cpu,
            "stalls": _stalls(self.response_times),
            "idle_grace": self.idle_grace,
            "grace_polls": self.grace_polls,
            "scheduler": _class_name(
                getattr(getattr(self.crawler.engine, "_slot", None), "scheduler", None)
            ),
            "stats": {
                k: v if isinstance(v, (int, float, str, bool)) or v is None else str(v)
                for k, v in stats.items()
            },
        }
        with open(self.stats_file, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=1, sort_keys=True)


def _class_name(obj: Any) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def _stalls(times: list[float], top: int = 5) -> list[list[float]]:
    """The ``top`` longest gaps between consecutive responses, as [seconds after the first
    response, gap in seconds], longest first: where the worker waited for work."""
    if len(times) < 2:
        return []
    gaps = sorted(((b - a, a - times[0]) for a, b in itertools.pairwise(times)), reverse=True)
    return [[round(at, 4), round(gap, 4)] for gap, at in gaps[:top]]


def _delta(a: os.times_result | None, b: os.times_result | None, i: int) -> float:
    """``os.times()`` field ``i`` (0 user, 1 system) of ``b`` minus that of ``a``."""
    return 0.0 if a is None or b is None else float(b[i] - a[i])
