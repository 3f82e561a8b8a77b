# mypy: disallow-subclassing-any=False
"""A RedisCrawlSpider: start URLs from ``REDIS_START_URLS_KEY`` (``srrules:seeds``),
links followed by rules."""

from collections.abc import Iterator
from typing import Any

from scrapy.http import Response
from scrapy.linkextractors import LinkExtractor
from scrapy.spiders import Rule
from scrapy_redis.spiders import RedisCrawlSpider


class RulesSpider(RedisCrawlSpider):
    name = "srrules"

    rules = (
        Rule(LinkExtractor(allow=r"/product/\d+$"), callback="parse_product"),
        Rule(LinkExtractor(allow=r"/category/\d+"), follow=True),
    )

    def parse_product(self, response: Response) -> Iterator[dict[str, Any]]:
        yield {"url": response.url, "sku": response.css(".sku::text").get()}
