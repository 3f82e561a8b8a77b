"""Scrapy integration: the scheduler, dupefilter, spiders and item pipeline.

In a project's ``settings.py``::

    SCHEDULER = "redcrawl.scrapy.Scheduler"
    DUPEFILTER_CLASS = "redcrawl.scrapy.DupeFilter"

or, the same as a Scrapy add-on (Scrapy 2.10+)::

    ADDONS = {"redcrawl.scrapy.Addon": 0}

With ``ROBOTSTXT_OBEY = True`` the scheduler puts :class:`RobotsTxtMiddleware` (robots.txt
once per site for the fleet) in place of Scrapy's own; with ``AUTOTHROTTLE_ENABLED`` on a
crawl with fleet-wide politeness, :class:`AutoThrottle` (one delay per site for the fleet)
in place of Scrapy's AutoThrottle; with fleet-wide politeness it adds
:class:`DeferMiddleware` (a 429/503 defers its request and blocks its site for the fleet).
"""

from redcrawl.scrapy.addon import Addon
from redcrawl.scrapy.autothrottle import AutoThrottle
from redcrawl.scrapy.defer import DeferMiddleware
from redcrawl.scrapy.dupefilter import DupeFilter
from redcrawl.scrapy.lifecycle import OutcomeMiddleware
from redcrawl.scrapy.robots import RobotsTxtMiddleware
from redcrawl.scrapy.scheduler import Scheduler, seed
from redcrawl.scrapy.spiders import RedisCrawlSpider, RedisMixin, RedisSpider

__all__ = [
    "Addon",
    "AutoThrottle",
    "DeferMiddleware",
    "DupeFilter",
    "OutcomeMiddleware",
    "RedisCrawlSpider",
    "RedisMixin",
    "RedisSpider",
    "RobotsTxtMiddleware",
    "Scheduler",
    "seed",
]
