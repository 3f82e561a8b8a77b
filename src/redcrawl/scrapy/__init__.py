"""Scrapy integration: the scheduler, dupefilter, spiders and item pipeline.

In a project's ``settings.py``::

    SCHEDULER = "redcrawl.scrapy.Scheduler"
    DUPEFILTER_CLASS = "redcrawl.scrapy.DupeFilter"
"""

from redcrawl.scrapy.dupefilter import DupeFilter
from redcrawl.scrapy.lifecycle import OutcomeMiddleware
from redcrawl.scrapy.scheduler import Scheduler, seed
from redcrawl.scrapy.spiders import RedisCrawlSpider, RedisMixin, RedisSpider

__all__ = ["DupeFilter", "OutcomeMiddleware", "RedisCrawlSpider", "RedisMixin", "RedisSpider",
           "Scheduler", "seed"]
