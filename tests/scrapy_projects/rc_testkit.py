"""Helpers loaded by the test spiders in their own Scrapy processes (never by pytest).

``RC_TEST_OUT=<path>`` (a Scrapy setting) turns on :class:`Report`: when the engine
stops it writes one JSON file with what the test asserts on: Scrapy's stats, every
response received (url, status, time), how many requests Scrapy dropped
(``request_dropped``), the spider's own ``report`` dict, and when the spider closed.
:class:`DropMiddleware` is a downloader middleware that raises ``IgnoreRequest`` for
requests with ``meta["drop"]``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from scrapy import signals
from scrapy.exceptions import IgnoreRequest, NotConfigured


class Report:
    def __init__(self, crawler: Any, path: str) -> None:
        self.crawler = crawler
        self.path = path
        self.started = time.time()
        self.responses: list[list[Any]] = []
        self.dropped: list[str] = []
        self.opened_at: float | None = None
        self.closed_at: float | None = None
        self.reason: str | None = None

    @classmethod
    def from_crawler(cls, crawler: Any) -> Report:
        path = crawler.settings.get("RC_TEST_OUT")
        if not path:
            raise NotConfigured
        ext = cls(crawler, path)
        crawler.signals.connect(ext.response_received, signals.response_received)
        crawler.signals.connect(ext.request_dropped, signals.request_dropped)
        crawler.signals.connect(ext.spider_opened, signals.spider_opened)
        crawler.signals.connect(ext.spider_closed, signals.spider_closed)
        crawler.signals.connect(ext.engine_stopped, signals.engine_stopped)
        return ext

    def response_received(self, response: Any, request: Any, spider: Any) -> None:
        self.responses.append([response.url, response.status, time.time()])

    def request_dropped(self, request: Any, spider: Any) -> None:
        self.dropped.append(request.url)

    def spider_opened(self, spider: Any) -> None:
        self.opened_at = time.time()

    def spider_closed(self, spider: Any, reason: str) -> None:
        self.closed_at = time.time()
        self.reason = reason
        self.spider_report = getattr(spider, "report", {})

    def engine_stopped(self) -> None:
        data = {
            "pid": os.getpid(),
            "started": self.started,
            "opened_at": self.opened_at,
            "closed_at": self.closed_at,
            "reason": self.reason,
            "responses": self.responses,
            "dropped": self.dropped,
            "spider": getattr(self, "spider_report", {}),
            "stats": self.crawler.stats.get_stats(),
            "scrapy_redis_loaded": any(m.split(".")[0] == "scrapy_redis" for m in sys.modules),
        }
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f, default=str)
        os.replace(tmp, self.path)


class DropMiddleware:
    """Downloader middleware: ``meta["drop"]`` -> IgnoreRequest (the request is done)."""

    def process_request(self, request: Any, spider: Any = None) -> None:
        if request.meta.get("drop"):
            raise IgnoreRequest("dropped by DropMiddleware")
        return None
