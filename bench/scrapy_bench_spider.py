"""The spider of ``bench/bench_scrapy_bench.py``: Scrapy's own ``scrapy bench`` spider.

The same crawl as ``scrapy bench`` (``scrapy.commands.bench._BenchSpider``): start at
``<url>/?total=100000&show=20`` (``dont_filter``), follow every link a
``LinkExtractor()`` finds with ``scrapy.Request(link.url, callback=self.parse)``. The
server (``scrapy.utils.benchserver.Root``) answers every page with 20 links to
``/follow?total=100000&show=20&n=<random 1..100000>``, so nearly every link of a
short crawl is new: about 20 new requests per page, a frontier that only grows.

Timing as ``crawl_spider.py`` (whose spider this extends), plus every response's
wall-clock time in the report (``response_times``), so that the benchmark can count the
pages of each worker inside one measurement window common to all of them.

Spider arguments: ``url`` (the bench server, ``http://127.0.0.1:PORT``), ``stats_file``,
``idle_grace`` (see crawl_spider.py).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import urlencode

import scrapy
from crawl_spider import CrawlBenchSpider
from scrapy.http import Response, TextResponse
from scrapy.linkextractors import LinkExtractor

TOTAL = 100_000
SHOW = 20


class ScrapyBenchSpider(CrawlBenchSpider):
    name = "follow"
    custom_settings = {
        # scrapy bench runs on Scrapy's defaults (CONCURRENT_REQUESTS 16, 8 per domain);
        # these only keep the workers quiet and independent of each other
        "LOG_LEVEL": "WARNING",
        "TELNETCONSOLE_ENABLED": False,
    }
    link_extractor = LinkExtractor()

    async def start(self) -> AsyncIterator[Any]:
        query = urlencode({"total": TOTAL, "show": SHOW}, doseq=True)
        yield scrapy.Request(f"{self.base_url}?{query}", dont_filter=True)

    def parse(self, response: Response) -> Iterator[scrapy.Request]:
        assert isinstance(response, TextResponse)
        for link in self.link_extractor.extract_links(response):
            yield scrapy.Request(link.url, callback=self.parse)

    def _on_closed(self, spider: Any, reason: str) -> None:
        super()._on_closed(spider, reason)
        if self.stats_file:
            with open(self.stats_file, encoding="utf-8") as fh:
                report = json.load(fh)
            report["response_times"] = self.response_times
            with open(self.stats_file, "w", encoding="utf-8") as fh:
                json.dump(report, fh)
