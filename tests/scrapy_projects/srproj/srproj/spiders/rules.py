"""A RedisCrawlSpider: start URLs from ``REDIS_START_URLS_KEY`` (``srrules:seeds``),
links followed by rules."""

from scrapy.linkextractors import LinkExtractor
from scrapy.spiders import Rule
from scrapy_redis.spiders import RedisCrawlSpider


class RulesSpider(RedisCrawlSpider):
    name = "srrules"

    rules = (
        Rule(LinkExtractor(allow=r"/product/\d+$"), callback="parse_product"),
        Rule(LinkExtractor(allow=r"/category/\d+"), follow=True),
    )

    def parse_product(self, response):
        yield {"url": response.url, "sku": response.css(".sku::text").get()}
