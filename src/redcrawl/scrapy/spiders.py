"""Spiders that take their start URLs from a Redis key, like scrapy-redis's.

``RedisSpider`` and ``RedisCrawlSpider`` read the key ``redis_key`` (default
``REDIS_START_URLS_KEY`` = ``"%(name)s:start_urls"``), a list (or a set with
``REDIS_START_URLS_AS_SET``), ``REDIS_START_URLS_BATCH_SIZE`` entries at a time: at start,
and again whenever the spider is idle. An entry is a plain URL or a JSON object::

    {"url": "https://example.com/p/1", "meta": {"source": "feed"}, "callback": "parse_item",
     "priority": 5, "method": "POST", "body": "...", "headers": {...}, "dont_filter": false}

Other keys of a JSON entry become form data, as in scrapy-redis. A bad entry is logged and
skipped; it never stops the spider.

Entries are popped atomically (one worker gets each) and handed straight to the
frontier. To seed a crawl durably, push URLs into the frontier itself instead:
``redcrawl seed URL...`` or :func:`redcrawl.scrapy.seed`.
"""

from __future__ import annotations

import inspect
import json
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any

import scrapy
from scrapy import signals
from scrapy.exceptions import DontCloseSpider
from scrapy.spiders import CrawlSpider, Spider

from redcrawl.connection import connect
from redcrawl.scrapy import lifecycle
from redcrawl.settings import Settings

__all__ = ["RedisCrawlSpider", "RedisMixin", "RedisSpider"]

_REQUEST_KEYS = {"url", "meta", "callback", "errback", "priority", "method", "body",
                 "headers", "dont_filter", "cookies", "cb_kwargs", "formdata"}


class RedisMixin:
    """Reads start requests from a Redis key. Mix into a Spider (see module docs)."""

    redis_key: str | None = None
    redis_batch_size: int | None = None
    max_idle_time: float | None = None

    crawler: Any
    name: str
    logger: Any

    def setup_redis(self, crawler: Any) -> None:
        settings = Settings.from_scrapy(crawler.settings)
        self._rc_settings = settings
        key = self.redis_key or settings.start_urls_key
        self.redis_key = key % {"name": self.name}
        if not self.redis_key.strip():
            raise ValueError("redis_key must not be empty")
        if self.redis_batch_size is None:
            self.redis_batch_size = settings.start_urls_batch_size
        if self.max_idle_time is None:
            self.max_idle_time = settings.max_idle_time
        self.server = connect(settings)
        self._as_set = settings.start_urls_as_set
        self._idle_since = time.monotonic()
        crawler.signals.connect(self.spider_idle, signal=signals.spider_idle)
        crawler.signals.connect(self._active, signal=signals.response_received)
        self.logger.info("Reading start URLs from redis key %r (batch size %d)",
                         self.redis_key, self.redis_batch_size)

    # --- reading the key -----------------------------------------------------------
    def fetch_data(self, count: int) -> list[bytes]:
        """Pop up to ``count`` entries, atomically (each entry goes to one worker)."""
        assert self.redis_key is not None
        server: Any = self.server
        data = (server.spop if self._as_set else server.lpop)(self.redis_key, count)
        return list(data or [])

    def next_requests(self) -> Iterator[scrapy.Request]:
        for data in self.fetch_data(self.redis_batch_size or 16):
            try:
                made = self.make_request_from_data(data)
            except (ValueError, TypeError, KeyError) as exc:
                self.logger.error("Skipping start entry %r from %r: %s", data[:200],
                                  self.redis_key, exc)
                continue
            if made is None:
                continue
            if isinstance(made, scrapy.Request):
                yield made
            else:
                yield from made

    def make_request_from_data(
        self, data: bytes
    ) -> scrapy.Request | Iterable[scrapy.Request] | None:
        """A request from one entry: a plain URL, or a JSON object (module docs)."""
        text = data.decode("utf-8").strip()
        if not text:
            return None
        if not text.startswith("{"):
            return scrapy.Request(text, dont_filter=True)
        params = json.loads(text)
        if not isinstance(params, dict) or not params.get("url"):
            raise ValueError("a JSON start entry needs a non-empty 'url'")
        kwargs: dict[str, Any] = {"dont_filter": params.get("dont_filter", True)}
        for name in ("meta", "priority", "method", "body", "headers", "cookies", "cb_kwargs"):
            if name in params:
                kwargs[name] = params[name]
        if "method" in kwargs:
            kwargs["method"] = str(kwargs["method"]).upper()
        for name in ("callback", "errback"):
            if params.get(name):
                kwargs[name] = self._entry_method(str(params[name]), name)
        formdata = params.get("formdata") or {
            k: v for k, v in params.items() if k not in _REQUEST_KEYS
        }
        if formdata:  # as scrapy-redis: GET with a query string unless a method is given
            kwargs.setdefault("method", "GET")
            return scrapy.FormRequest(params["url"], formdata=formdata, **kwargs)
        return scrapy.Request(params["url"], **kwargs)

    def _entry_method(self, name: str, what: str) -> Any:
        """A spider method named by a start entry: anyone who can write to the key picks
        it, so only the spider's own public methods qualify (``parse`` included), never a
        private one or one of Scrapy's or this mixin's."""
        method = getattr(self, name, None)
        inherited = (name != "parse" and any(
            hasattr(base, name) for base in (Spider, CrawlSpider, RedisMixin)))
        if name.startswith("_") or inherited or not inspect.ismethod(method):
            raise ValueError(f"{what} {name!r} is not one of the spider's own methods")
        return method

    # --- feeding the engine -------------------------------------------------------
    async def start(self) -> AsyncIterator[Any]:
        for request in self.next_requests():
            yield request

    def start_requests(self) -> Iterator[scrapy.Request]:  # Scrapy < 2.13
        return self.next_requests()

    def schedule_next_requests(self) -> int:
        n = 0
        for request in self.next_requests():
            self.crawler.engine.crawl(request)
            n += 1
        if n:
            scheduler = lifecycle.scheduler_of(self.crawler)
            flush = getattr(scheduler, "flush", None)
            if flush is not None:
                flush()  # into the frontier now: the entries are off the Redis key
        return n

    def _active(self, *args: Any, **kwargs: Any) -> None:
        self._idle_since = time.monotonic()

    def spider_idle(self) -> None:
        """Fetch more start URLs; close only after ``max_idle_time`` seconds with neither
        new start URLs nor responses, i.e. since the crawl went quiet (0: never,
        scrapy-redis's default)."""
        if self.schedule_next_requests():
            self._idle_since = time.monotonic()
            raise DontCloseSpider
        idle = time.monotonic() - self._idle_since
        if self.max_idle_time and idle >= self.max_idle_time:
            return
        raise DontCloseSpider


class RedisSpider(RedisMixin, Spider):
    """A Spider whose start URLs come from Redis (``redis_key``)."""

    @classmethod
    def from_crawler(cls, crawler: Any, *args: Any, **kwargs: Any) -> RedisSpider:
        spider = super().from_crawler(crawler, *args, **kwargs)
        spider.setup_redis(crawler)
        return spider


class RedisCrawlSpider(RedisMixin, CrawlSpider):
    """A CrawlSpider (rules) whose start URLs come from Redis (``redis_key``)."""

    @classmethod
    def from_crawler(cls, crawler: Any, *args: Any, **kwargs: Any) -> RedisCrawlSpider:
        spider = super().from_crawler(crawler, *args, **kwargs)
        spider.setup_redis(crawler)
        return spider
