"""The shop crawl (``-a url=...``) with :class:`StallProbe`, which measures how late
Scrapy's reactor runs a timer (a stall of the reactor: no downloads, no callbacks)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import scrapy
from scrapy import signals
from twisted.internet import task

INTERVAL = 0.02
"""Seconds between the probe's ticks."""


class StallProbe:
    """Extension: a LoopingCall every INTERVAL; the longest lateness (ms) and every
    lateness over 50 ms (wall time, ms) go to the stats (``probe/*``)."""

    def __init__(self, crawler: Any) -> None:
        self.crawler = crawler
        self.last = 0.0
        self.worst = 0.0
        self.stalls: list[list[float]] = []
        self.loop = task.LoopingCall(self.tick)

    @classmethod
    def from_crawler(cls, crawler: Any) -> StallProbe:
        probe = cls(crawler)
        crawler.signals.connect(probe.opened, signals.spider_opened)
        crawler.signals.connect(probe.closed, signals.spider_closed)
        return probe

    def opened(self, spider: Any) -> None:
        self.last = time.monotonic()
        self.loop.start(INTERVAL, now=False)

    def tick(self) -> None:
        now = time.monotonic()
        late = (now - self.last - INTERVAL) * 1000
        self.last = now
        if late > self.worst:
            self.worst = late
            self.crawler.stats.set_value("probe/max_stall_ms", round(late, 1))
        if late > 50:
            self.stalls.append([time.time(), round(late, 1)])
            self.crawler.stats.set_value("probe/stalls", self.stalls)

    def closed(self, spider: Any, reason: str) -> None:
        if self.loop.running:
            self.loop.stop()


class OutageShop(scrapy.Spider):
    name = "outageshop"
    custom_settings = {"EXTENSIONS": {"rc_testkit.Report": 500,
                                      "outage_spider.StallProbe": 400}}

    def __init__(self, url: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_urls = [url] if url else []

    def parse(self, response: scrapy.http.Response) -> Iterator[Any]:
        for href in response.css("a::attr(href)").getall():
            yield response.follow(href, callback=self.parse)
