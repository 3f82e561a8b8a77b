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


def run_wait() -> float:
    """Seconds this thread has spent runnable but waiting for a CPU (Linux schedstat):
    on a loaded machine the reactor is late by that much without anything blocking it."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


class StallProbe:
    """Extension: a LoopingCall every INTERVAL. Every lateness over 50 ms goes to the
    stats (``probe/stalls``: wall time, lateness in ms, and the part of it not spent
    waiting for a CPU, i.e. the reactor blocked or busy), with the longest ones
    (``probe/max_stall_ms``, ``probe/max_blocked_ms``)."""

    def __init__(self, crawler: Any) -> None:
        self.crawler = crawler
        self.last = 0.0
        self.last_wait = 0.0
        self.worst = 0.0
        self.worst_blocked = 0.0
        self.stalls: list[list[float]] = []
        self.loop = task.LoopingCall(self.tick)

    @classmethod
    def from_crawler(cls, crawler: Any) -> StallProbe:
        probe = cls(crawler)
        crawler.signals.connect(probe.opened, signals.spider_opened)
        crawler.signals.connect(probe.closed, signals.spider_closed)
        return probe

    def opened(self, spider: Any) -> None:
        self.last, self.last_wait = time.monotonic(), run_wait()
        self.loop.start(INTERVAL, now=False)

    def tick(self) -> None:
        now, wait = time.monotonic(), run_wait()
        late = (now - self.last - INTERVAL) * 1000
        blocked = max(0.0, late - (wait - self.last_wait) * 1000)
        self.last, self.last_wait = now, wait
        stats = self.crawler.stats
        if late > self.worst:
            self.worst = late
            stats.set_value("probe/max_stall_ms", round(late, 1))
        if blocked > self.worst_blocked:
            self.worst_blocked = blocked
            stats.set_value("probe/max_blocked_ms", round(blocked, 1))
        if late > 50:
            self.stalls.append([time.time(), round(late, 1), round(blocked, 1)])
            stats.set_value("probe/stalls", self.stalls)

    def closed(self, spider: Any, reason: str) -> None:
        if self.loop.running:
            self.loop.stop()


class OutageShop(scrapy.Spider):
    name = "outageshop"
    custom_settings = {"EXTENSIONS": {"rc_testkit.Report": 500, "outage_spider.StallProbe": 400}}

    def __init__(self, url: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_urls = [url] if url else []

    def parse(self, response: scrapy.http.Response) -> Iterator[Any]:
        for href in response.css("a::attr(href)").getall():
            yield response.follow(href, callback=self.parse)
