"""``DUPEFILTER_CLASS = "redcrawl.scrapy.DupeFilter"``.

With redcrawl's scheduler the frontier itself filters duplicates (in the same atomic step
that enqueues), and this class only logs filtered requests the way Scrapy's own filter
does. Used with another scheduler, ``request_seen`` is a shared, exact filter in Redis:
the crawl's DONE fingerprints plus a set of fingerprints seen through this filter.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from redcrawl.connection import connect
from redcrawl.fingerprint import request_fingerprint
from redcrawl.keys import CrawlKeys
from redcrawl.settings import Settings

if TYPE_CHECKING:
    import scrapy
    from scrapy.crawler import Crawler

__all__ = ["DupeFilter"]

log = logging.getLogger(__name__)


class DupeFilter:
    def __init__(self, settings: Settings, *, debug: bool = False,
                 crawler: Crawler | None = None) -> None:
        self.settings = settings
        self.debug = debug
        self.crawler = crawler
        self.logdupes = True
        self._client: Any = None
        self._keys: CrawlKeys | None = None

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> DupeFilter:
        return cls(Settings.from_scrapy(crawler.settings),
                   debug=crawler.settings.getbool("DUPEFILTER_DEBUG"), crawler=crawler)

    def open(self) -> None:
        return None

    def close(self, reason: str) -> None:
        if self._client is not None:
            self._client.close()

    def request_seen(self, request: scrapy.Request) -> bool:
        """True if a request with this fingerprint was seen before, anywhere in the crawl."""
        if self._client is None:
            spider = getattr(self.crawler, "spider", None)
            name = self.settings.crawl_name(getattr(spider, "name", None))
            self._keys = CrawlKeys(name, prefix=self.settings.key_prefix,
                                   tiers=self.settings.tiers)
            self._client = connect(self.settings)
        assert self._keys is not None
        fp = request_fingerprint(request)
        if self._client.sismember(self._keys.fp_done, fp):
            return True
        return not self._client.sadd(self._keys.fp_seen, fp)

    def log(self, request: scrapy.Request, spider: scrapy.Spider) -> None:
        if self.debug:
            log.debug("Filtered duplicate request: %(request)s", {"request": request},
                      extra={"spider": spider})
        elif self.logdupes:
            log.debug("Filtered duplicate request: %(request)s - no more duplicates will be "
                      "shown (see DUPEFILTER_DEBUG to show all duplicates)",
                      {"request": request}, extra={"spider": spider})
            self.logdupes = False
        if self.crawler is not None and self.crawler.stats is not None:
            self.crawler.stats.inc_value("dupefilter/filtered")
