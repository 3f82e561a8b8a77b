"""Start URLs from the Redis list ``srspider:start_urls``: plain URLs or JSON
``{"url": ..., "meta": {...}}``. A start page whose meta has ``fanout`` also requests
``/product/<100 + p>`` with priority ``p`` for each ``p`` in it."""

from scrapy import Request
from scrapy_redis.spiders import RedisSpider


class ShopSpider(RedisSpider):
    name = "srspider"
    redis_key = "srspider:start_urls"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.report = {"meta": []}

    def parse(self, response):
        out = []
        if "source" in response.meta:
            self.report["meta"].append([response.url, response.meta["source"]])
        base = response.urljoin("/")
        for p in response.meta.get("fanout", ()):
            out.append(Request(f"{base}product/{100 + p}", priority=p))
        for href in response.css("a::attr(href)").getall():
            out.append(response.follow(href))
        return out
