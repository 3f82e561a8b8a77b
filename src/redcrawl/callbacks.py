"""Which spider methods a stored request may name as its callback or errback.

One rule everywhere (the API at submit, the codec at decode, RedisSpider start entries):
a callback is a public method defined on the spider's own class or its project base
classes, never a method of ``scrapy.Spider``, Scrapy's generic spiders or redcrawl's
mixins (``start_requests``, ``_set_crawler``, ``spider_idle``, ``close``...), and never a
name starting with ``_``. :func:`callback_name_problem` is the part of the rule that needs
no spider (used at submit); :func:`callback_problem` and :func:`resolve_callback` are the
whole rule.

One exception: the callbacks Scrapy's generic spiders give their own requests
(``CrawlSpider._callback`` / ``_errback`` for rule links, ``SitemapSpider._parse_sitemap``)
travel through the frontier too, so they are allowed on spiders of those classes (and only
in stored requests: :func:`callback_name_problem`, used at submit, still refuses them).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

__all__ = ["callback_name_problem", "callback_problem", "framework_names", "resolve_callback"]


@functools.cache
def framework_names() -> frozenset[str]:
    """Every attribute of the framework classes a callback may not be: ``scrapy.Spider``,
    Scrapy's generic spiders and redcrawl's spider mixins."""
    import scrapy
    from scrapy.spiders import CrawlSpider, CSVFeedSpider, SitemapSpider, XMLFeedSpider

    from redcrawl.scrapy.spiders import RedisMixin

    names: set[str] = set()
    for cls in (
        scrapy.Spider,
        CrawlSpider,
        XMLFeedSpider,
        CSVFeedSpider,
        SitemapSpider,
        RedisMixin,
    ):
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
        return (
            f"{name!r} is a method of Scrapy's or redcrawl's spider classes, not a "
            "callback of your spider"
        )
    return None


@functools.cache
def _generic_entry_points() -> tuple[tuple[type, frozenset[str]], ...]:
    from scrapy.spiders import CrawlSpider, SitemapSpider

    return (
        (CrawlSpider, frozenset({"_callback", "_errback"})),
        (SitemapSpider, frozenset({"_parse_sitemap"})),
    )


def callback_problem(spider: Any, name: str) -> str | None:
    """Why ``spider`` may not be called back by ``name`` (words, starting with the
    quoted name), or None when it may."""
    if name in getattr(spider, "__dict__", ()):
        return f"{name!r} is an attribute of the spider object, not a method of its class"
    cls: Any = spider.__class__
    return _class_problem(cls, name)  # cached per (class, name)


@functools.lru_cache(maxsize=4096)
def _class_problem(cls: Any, name: Any) -> str | None:
    if not isinstance(name, str):
        return f"{name!r} is not a method name"
    if any(issubclass(cls, base) and name in names for base, names in _generic_entry_points()):
        return None
    problem = callback_name_problem(name)
    if problem is not None:
        return problem
    spider_name = getattr(cls, "name", None) or cls.__name__
    fn = inspect.getattr_static(cls, name, None)
    if fn is None:
        return f"{name!r} is not a method of spider {spider_name!r}"
    if not inspect.isfunction(fn):
        return (
            f"{name!r} is not a method of spider {spider_name!r} (an attribute, a "
            "static or class method, or a property)"
        )
    return None


def resolve_callback(spider: Any, name: str) -> Any | None:
    """The bound method ``name`` of ``spider`` when the rule allows it, else None."""
    if callback_problem(spider, name) is not None:
        return None
    fn = getattr(spider, name, None)
    if not inspect.ismethod(fn) or fn.__self__ is not spider:
        return None
    return fn
