"""Which spider methods a stored request may name as its callback or errback.

One rule everywhere (the API at submit, the codec at decode, RedisSpider start entries):
a callback is a public method defined on the spider's own class or its project base
classes, never a method of ``scrapy.Spider``, Scrapy's generic spiders or redcrawl's
mixins (``start_requests``, ``_set_crawler``, ``spider_idle``, ``close``...), and never a
name starting with ``_``. :func:`callback_name_problem` is the part of the rule that needs
no spider (used at submit); :func:`resolve_callback` is the whole rule.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

__all__ = ["callback_name_problem", "framework_names", "resolve_callback"]


@functools.cache
def framework_names() -> frozenset[str]:
    """Every attribute of the framework classes a callback may not be: ``scrapy.Spider``,
    Scrapy's generic spiders and redcrawl's spider mixins."""
    import scrapy
    from scrapy.spiders import CrawlSpider, CSVFeedSpider, SitemapSpider, XMLFeedSpider

    from redcrawl.scrapy.spiders import RedisMixin

    names: set[str] = set()
    for cls in (scrapy.Spider, CrawlSpider, XMLFeedSpider, CSVFeedSpider, SitemapSpider,
                RedisMixin):
        for klass in cls.__mro__:
            names.update(vars(klass))
    # the spider's default callbacks are framework names, yet they are what users mean
    names.discard("parse")
    names.discard("parse_start_url")
    names.add("closed")  # Spider.close() calls it with the close reason
    return frozenset(names)


def callback_name_problem(name: str) -> str | None:
    """Why ``name`` can never be a callback, or None when it may be one (whether the
    spider has such a method is checked when a worker decodes the request)."""
    if not name.isidentifier():
        return f"{name!r} is not a Python identifier"
    if name.startswith("_"):
        return f"{name!r} is private (starts with '_'): only public spider methods"
    if name in framework_names():
        return (f"{name!r} is a method of Scrapy's or redcrawl's spider classes, not a "
                "callback of your spider")
    return None


def resolve_callback(spider: Any, name: str) -> Any | None:
    """The bound method ``name`` of ``spider`` when the rule allows it, else None."""
    if callback_name_problem(name) is not None:
        return None
    fn = getattr(spider, name, None)
    if not inspect.ismethod(fn) or fn.__self__ is not spider:
        return None
    return fn
