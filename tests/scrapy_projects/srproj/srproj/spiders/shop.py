# mypy: disallow-subclassing-any=False
"""Start URLs from the Redis list ``srspider:start_urls``: plain URLs or JSON
``{"url": ..., "meta": {...}}``. A start page whose meta has ``fanout`` also requests
``/product/<100 + p>`` with priority ``p`` for each ``p`` in it."""

from collections.abc import Iterable
from typing import Any

from scrapy import Request
from scrapy.http import Response
from scrapy_redis.spiders import RedisSpider


class ShopSpider(RedisSpider):
    name = "srspider"
    redis_key = "srspider:start_urls"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.report: dict[str, list[list[Any]]] = {"meta": []}

    def parse(self, response: Response, **kwargs: Any) -> Iterable[Request]:
        out: list[Request] = []
        if "source" in response.meta:
            self.report["meta"].append([response.url, response.meta["source"]])
        base = response.urljoin("/")
        for p in response.meta.get("fanout", ()):
            out.append(Request(f"{base}product/{100 + p}", priority=p))
        for href in response.css("a::attr(href)").getall():
            out.append(response.follow(href))
        return out
