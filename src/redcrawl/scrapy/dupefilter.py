"""``DUPEFILTER_CLASS = "redcrawl.scrapy.DupeFilter"``.

With redcrawl's scheduler the frontier itself filters duplicates (in the same atomic step
that enqueues), and this class only logs filtered requests the way Scrapy's own filter
does. Used with another scheduler, ``request_seen`` is a shared filter in Redis: the
crawl's DONE fingerprints plus a filter (of the crawl's dedupe mode) of fingerprints seen
through this class. On a partitioned crawl (``REDCRAWL_PARTITIONS`` > 1) the DONE
fingerprints asked are those of the request's partition (its politeness key's, as a push
routes it; fingerprints imported alone are in every partition): two script calls per
request whatever the number of partitions.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from redcrawl.connection import connect
from redcrawl.dedupe import Filter
from redcrawl.envelope import Envelope
from redcrawl.fingerprint import canonicalizer_for, request_fingerprint
from redcrawl.frontier import FrontierCore, PartitionedFrontier, open_frontier
from redcrawl.scrapy.one_off import local_dupefilter, one_off_command
from redcrawl.settings import Settings

if TYPE_CHECKING:
    import scrapy
    from scrapy.crawler import Crawler

__all__ = ["DupeFilter"]

log = logging.getLogger(__name__)


class DupeFilter:
    def __init__(
        self, settings: Settings, *, debug: bool = False, crawler: Crawler | None = None
    ) -> None:
        from redcrawl.scrapy.lifecycle import custom_fingerprinter

        self.settings = settings
        self.debug = debug
        self.crawler = crawler
        self.logdupes = True
        self._client: Any = None
        self._frontier: FrontierCore | None = None
        self._seen: Filter | None = None
        self._canonicalizer = canonicalizer_for(settings)
        # the project's REQUEST_FINGERPRINTER_CLASS, unless it is Scrapy's default
        self._fingerprinter = custom_fingerprinter(crawler) if crawler is not None else None

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Any:
        """This filter, or Scrapy's own under a one-off command (``scrapy shell``,
        ``parse``...: :mod:`redcrawl.scrapy.one_off`)."""
        command = one_off_command()
        if command is not None:
            return local_dupefilter(crawler, command)
        return cls(
            Settings.from_scrapy(crawler.settings),
            debug=crawler.settings.getbool("DUPEFILTER_DEBUG"),
            crawler=crawler,
        )

    def open(self) -> None:
        return None

    def close(self, reason: str) -> None:
        if self._client is not None:
            self._client.close()

    def request_seen(self, request: scrapy.Request) -> bool:
        """True if a request with this fingerprint was seen before, anywhere in the crawl."""
        if self._frontier is None or self._seen is None:
            spider = getattr(self.crawler, "spider", None)
            name = self.settings.crawl_name(getattr(spider, "name", None))
            self._client = connect(self.settings)
            self._frontier = open_frontier(self._client, self.settings, name)
            self._seen = Filter(self._client, self._frontier.dedupe, self._frontier.keys.fp_seen)
        fp = (
            self._fingerprinter(request)
            if self._fingerprinter is not None
            else request_fingerprint(
                request,
                canonicalizer=self._canonicalizer,
                version_meta_key=self.settings.fingerprint_version_meta,
            )
        )
        if self._done(request).contains([fp])[0]:
            return True
        return not self._seen.add([fp])[0]

    def _done(self, request: scrapy.Request) -> Filter:
        """The DONE fingerprints that may hold ``request``'s: on a partitioned crawl its
        partition's (a push checks only those), else the crawl's."""
        frontier = self._frontier
        assert frontier is not None
        if not isinstance(frontier, PartitionedFrontier):
            return frontier.done
        slot = request.meta.get("download_slot")
        meta = {} if slot is None else {"download_slot": slot}
        return frontier.parts[frontier.partition(Envelope(url=request.url, meta=meta))].done

    def log(self, request: scrapy.Request, spider: scrapy.Spider) -> None:
        if self.debug:
            log.debug(
                "Filtered duplicate request: %(request)s",
                {"request": request},
                extra={"spider": spider},
            )
        elif self.logdupes:
            log.debug(
                "Filtered duplicate request: %(request)s - no more duplicates will be "
                "shown (see DUPEFILTER_DEBUG to show all duplicates)",
                {"request": request},
                extra={"spider": spider},
            )
            self.logdupes = False
        if self.crawler is not None and self.crawler.stats is not None:
            self.crawler.stats.inc_value("dupefilter/filtered")
