"""enqueue_request's answers: the start page's callback yields one page twice (Scrapy
drops the second: ``request_dropped``), asks the scheduler directly to enqueue another
page twice (reported in ``report["direct"]``), and yields a request whose meta can't be
stored."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import scrapy


class Enqueue(scrapy.Spider):
    name = "enqueue"
    custom_settings = {"EXTENSIONS": {"rc_testkit.Report": 500}}

    def __init__(self, url: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.base = url
        self.start_urls = [url + "/"]
        self.report: dict[str, Any] = {}

    def parse(self, response: scrapy.http.Response) -> Iterator[Any]:
        if response.url != self.base + "/":
            return
        yield scrapy.Request(self.base + "/product/1")
        yield scrapy.Request(self.base + "/product/1")
        engine = self.crawler.engine
        slot: Any = getattr(engine, "_slot", None) or getattr(engine, "slot", None)
        scheduler = slot.scheduler  # 2.13+ / 2.11
        self.report["direct"] = [
            scheduler.enqueue_request(scrapy.Request(self.base + "/product/2")),
            scheduler.enqueue_request(scrapy.Request(self.base + "/product/2")),
        ]
        yield scrapy.Request(self.base + "/product/3", meta={"obj": object()})
        yield scrapy.Request(self.base + "/product/4")
