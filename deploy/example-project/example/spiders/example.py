"""A RedisSpider: it waits for start URLs pushed into Redis (`redcrawl seed --crawl
example URL...`), follows links on the same site and yields each page's title."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from scrapy.http import Response

from redcrawl.scrapy import RedisSpider


class ExampleSpider(RedisSpider):
    name = "example"

    def parse(self, response: Response) -> Iterator[Any]:
        yield {"url": response.url, "title": response.css("title::text").get()}
        site = urlsplit(response.url).netloc
        for href in response.css("a::attr(href)").getall():
            url = response.urljoin(href)
            if urlsplit(url).netloc == site:
                yield response.follow(url, callback=self.parse)
