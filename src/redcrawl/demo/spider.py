"""The demo spider: crawls the bundled shop site and scrapes one item per product.

Run by ``redcrawl demo``, which serves the site and passes its address as the spider
argument ``url``; it is an ordinary Scrapy spider, nothing in it is redcrawl-specific.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import scrapy
from scrapy.http import Response


class ShopSpider(scrapy.Spider):
    name = "shop"

    def __init__(self, url: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_urls = [url or "http://127.0.0.1:8000"]

    def parse(self, response: Response) -> Iterator[Any]:
        """Home and category pages: follow every link."""
        for href in response.css("a::attr(href)").getall():
            if "/product/" in href:
                yield response.follow(href, callback=self.parse_product)
            else:
                yield response.follow(href, callback=self.parse)

    def parse_product(self, response: Response) -> Iterator[Any]:
        data = response.css('script[type="application/ld+json"]::text').get()
        if data:
            item = json.loads(data)
            yield {
                "sku": item.get("sku"),
                "name": item.get("name"),
                "price": item.get("offers", {}).get("price", item.get("price")),
                "category": item.get("category"),
                "url": response.url,
            }
        yield from self.parse(response)
