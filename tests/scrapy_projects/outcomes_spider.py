"""One request per outcome, all children of the start page (``-a url=<site>``,
``-a dead=<closed port>``); ``-a start=<path>,<path>...`` starts there instead (and
yields nothing)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import scrapy

BOOM = "/product/1"  # the callback raises
POISON = "/product/7"  # always 500 (SiteConfig.always_fail)
FLAKY = "/product/5"  # 500 once, then 200 (SiteConfig.error_every=5)
MISSING = "/product/999"  # 404
DROPPED = "/product/2"  # IgnoreRequest from a downloader middleware
FINE = "/product/3"


class Outcomes(scrapy.Spider):
    name = "outcomes"
    custom_settings = {
        "EXTENSIONS": {"rc_testkit.Report": 500},
        "DOWNLOADER_MIDDLEWARES": {"rc_testkit.DropMiddleware": 50},
    }

    def __init__(self, url: str = "", dead: str = "1", start: str = "/", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.base = url
        self.dead = dead
        self.start_urls = [url + path for path in start.split(",")]

    def parse(self, response: scrapy.http.Response) -> Iterator[Any]:
        if response.url != self.base + "/":
            return
        yield scrapy.Request(self.base + BOOM, callback=self.parse_boom)
        yield scrapy.Request(self.base + POISON)
        yield scrapy.Request(self.base + FLAKY)
        yield scrapy.Request(f"http://127.0.0.1:{self.dead}/unreachable")
        yield scrapy.Request(self.base + MISSING)
        yield scrapy.Request(self.base + DROPPED, meta={"drop": True})
        yield scrapy.Request(self.base + FINE)

    def parse_boom(self, response: scrapy.http.Response) -> Iterator[Any]:
        raise ValueError("boom in the callback")
        yield  # a generator, like most callbacks
