"""Follows every link of the test shop from ``-a url=...`` (no start URL without it)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import scrapy


class ShopCrawl(scrapy.Spider):
    name = "shopcrawl"
    custom_settings = {"EXTENSIONS": {"rc_testkit.Report": 500}}

    def __init__(self, url: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_urls = [url] if url else []

    def parse(self, response: scrapy.http.Response) -> Iterator[Any]:
        for href in response.css("a::attr(href)").getall():
            yield response.follow(href, callback=self.parse)
