"""Spiders that take their start URLs from a Redis key, like scrapy-redis's.

``RedisSpider`` and ``RedisCrawlSpider`` read the key ``redis_key`` (default
``REDIS_START_URLS_KEY`` = ``"%(name)s:start_urls"``), a list (or a set with
``REDIS_START_URLS_AS_SET``, or a sorted set, highest score first, with
``REDIS_START_URLS_AS_ZSET``), ``REDIS_START_URLS_BATCH_SIZE`` entries at a time: at
start, and again whenever the spider is idle. An entry is a plain URL or a JSON object::

    {"url": "https://example.com/p/1", "meta": {"source": "feed"}, "callback": "parse_item",
     "priority": 5, "method": "POST", "body": "...", "headers": {...}, "dont_filter": true}

Other keys of a JSON entry become form data, as in scrapy-redis.

Every entry is handled the same way, whether it was read at start or while the spider was
idle, as scrapy-redis does: it is always fetched (``dont_filter`` is True unless a JSON
entry says false: not deduplicated, not dropped as offsite). Only http(s) URLs are
accepted unless the spider lists more schemes in ``redis_start_url_schemes`` (e.g.
``{"http", "https", "ftp"}``); a callback must be a public method of the spider's own
class (:mod:`redcrawl.callbacks`). A refused or malformed entry is logged with the reason
and counted (stat ``redcrawl/start_entries/refused``); it never stops the spider.

A start key that cannot be read (a key of another type than the settings say, or one an
ACL user may not touch) closes the spider with a message naming the key and what to do
(reason ``redcrawl_start_key``).

Entries are popped atomically (one worker gets each) and handed straight to the
frontier. To seed a crawl durably, push URLs into the frontier itself instead:
``redcrawl seed URL...`` or :func:`redcrawl.scrapy.seed`.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any, cast

import redis
import scrapy
from scrapy import signals
from scrapy.exceptions import DontCloseSpider
from scrapy.spiders import CrawlSpider, Spider

from redcrawl.callbacks import callback_problem, resolve_callback
from redcrawl.connection import connect
from redcrawl.errors import ConfigError
from redcrawl.scrapy import lifecycle
from redcrawl.settings import Settings
from redcrawl.urls import HTTP_SCHEMES, url_problem

__all__ = ["RedisCrawlSpider", "RedisMixin", "RedisSpider"]

_REQUEST_KEYS = {
    "url",
    "meta",
    "callback",
    "errback",
    "priority",
    "method",
    "body",
    "headers",
    "dont_filter",
    "cookies",
    "cb_kwargs",
    "formdata",
}


class RedisMixin:
    """Reads start requests from a Redis key. Mix into a Spider (see module docs)."""

    redis_key: str | None = None
    redis_batch_size: int | None = None
    max_idle_time: float | None = None
    redis_start_url_schemes: Iterable[str] = HTTP_SCHEMES
    """URL schemes start entries may use; http and https unless the spider opts in."""

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
        if settings.start_urls_as_set and settings.start_urls_as_zset:
            raise ConfigError(
                "REDIS_START_URLS_AS_ZSET",
                "REDIS_START_URLS_AS_SET is on too; "
                "the start key is either a set or a sorted set: turn one off",
            )
        self._key_type = (
            "zset"
            if settings.start_urls_as_zset
            else "set"
            if settings.start_urls_as_set
            else "list"
        )
        self._schemes = frozenset(s.lower() for s in self.redis_start_url_schemes)
        self._closing = False
        self._idle_since = time.monotonic()
        crawler.signals.connect(self.spider_idle, signal=signals.spider_idle)
        crawler.signals.connect(self._active, signal=signals.response_received)
        self.logger.info(
            "Reading start URLs from redis key %r (batch size %d)",
            self.redis_key,
            self.redis_batch_size,
        )

    # --- reading the key -----------------------------------------------------------
    def fetch_data(self, count: int) -> list[bytes]:
        """Pop up to ``count`` entries, atomically (each entry goes to one worker).
        :class:`~redcrawl.errors.ConfigError` when the key can't be read as configured."""
        assert self.redis_key is not None
        server: Any = self.server
        try:
            if self._key_type == "zset":
                data = [member for member, _ in server.zpopmax(self.redis_key, count)]
            elif self._key_type == "set":
                data = server.spop(self.redis_key, count)
            else:
                data = server.lpop(self.redis_key, count)
        except redis.exceptions.NoPermissionError as exc:
            raise ConfigError(
                "REDIS_START_URLS_KEY",
                f"the Redis user may not read the start key {self.redis_key!r} ({exc}). "
                f"Allow it in the user's ACL (ACL SETUSER <user> ~{self.redis_key}), or move "
                "the key inside the user's key pattern with REDIS_START_URLS_KEY or the "
                "spider's redis_key (e.g. 'rc:%(name)s:start_urls' for ~rc:*)",
            ) from None
        except redis.exceptions.ResponseError as exc:
            if "WRONGTYPE" not in str(exc):
                raise
            actual = server.type(self.redis_key)
            actual = actual.decode() if isinstance(actual, bytes) else str(actual)
            setting = {"set": "REDIS_START_URLS_AS_SET", "zset": "REDIS_START_URLS_AS_ZSET"}
            fix = (
                f"set {setting[actual]} = True"
                if actual in setting
                else "turn REDIS_START_URLS_AS_SET and REDIS_START_URLS_AS_ZSET off"
                if actual == "list"
                else "delete it or point REDIS_START_URLS_KEY elsewhere"
            )
            raise ConfigError(
                setting.get(self._key_type, "REDIS_START_URLS_KEY"),
                f"start key {self.redis_key!r} is a Redis {actual}, but the spider reads it "
                f"as a {self._key_type}; {fix}",
            ) from None
        return list(data or [])

    def _refuse(self, data: bytes, reason: str) -> None:
        self.logger.error("Skipping start entry %r from %r: %s", data[:200], self.redis_key, reason)
        self.crawler.stats.inc_value("redcrawl/start_entries/refused")

    def next_requests(self) -> Iterator[Any]:
        if self._closing:
            return
        try:
            batch = self.fetch_data(self.redis_batch_size or 16)
        except ConfigError as exc:
            self._closing = True
            self.logger.error("Closing the spider: %s", exc)
            lifecycle.fail_process(self.crawler)  # scrapy crawl exits 1, not 0
            from twisted.internet import reactor

            # later, not from inside the engine's read of start requests (Scrapy 2.11
            # fails if the slot goes away while it iterates them)
            cast(Any, reactor).callLater(
                0, lifecycle.stop_crawler, self.crawler, "redcrawl_start_key"
            )
            return
        for data in batch:
            try:
                made = self.make_request_from_data(data)
            except (ValueError, TypeError, KeyError, UnicodeError) as exc:
                self._refuse(data, str(exc))
                continue
            if made is None:
                continue
            for request in [made] if isinstance(made, scrapy.Request) else made:
                if not isinstance(request, scrapy.Request):
                    yield request  # an overridden make_request_from_data's own output
                    continue
                problem = url_problem(request.url, self._schemes)
                if problem is not None:
                    hint = (
                        " (a spider allows more schemes with redis_start_url_schemes)"
                        if problem.startswith("it is not an absolute")
                        else ""
                    )
                    self._refuse(data, f"URL {request.url!r}: {problem}{hint}")
                    continue
                # the same whether read at start or when idle, as in scrapy-redis: not
                # a Scrapy start request (those are deduplicated by the scheduler)
                request.meta["is_start_request"] = False
                self.crawler.stats.inc_value("redcrawl/start_entries/accepted")
                yield request

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
        it, so the rule of :mod:`redcrawl.callbacks` applies (public methods of the
        spider's own class, ``parse`` included)."""
        problem = callback_problem(self, name)
        method = resolve_callback(self, name) if problem is None else None
        if method is None:
            raise ValueError(
                f"{what} {problem or repr(name) + ' is not a method'}; a start "
                "entry may name only a public method of the spider's own class"
            )
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
