"""One callback rule everywhere (issue 11 item 5): an envelope written straight to Redis
naming a framework method (``_set_crawler``, ``start_requests``, ``spider_idle``) is never
called: the worker dead-letters it with the reason, and the crawl goes on."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import scrapy
from scrapy.linkextractors import LinkExtractor
from scrapy.spiders import CrawlSpider, Rule, SitemapSpider

from redcrawl.codec import Envelope, decode, encode, from_request, to_request
from redcrawl.demo import ShopSite, SiteConfig
from redcrawl.errors import DecodeError, EncodeError
from tests.conftest import RedisServer
from tests.scrapy_projects.harness import frontier, run_spider

FORBIDDEN = [
    "_set_crawler",
    "start_requests",
    "spider_idle",
    "close",
    "closed",
    "from_crawler",
    "setup_redis",
    "_private",
    "__init__",
    "logger",
    "name",
]


@pytest.fixture
def site() -> Iterator[ShopSite]:
    with ShopSite(SiteConfig(products=6, per_page=3, categories=2, tracking_params=False)) as s:
        yield s


def test_forbidden_callbacks_in_redis_are_dead_letters_never_calls(
    tmp_path: Path, redis7: RedisServer, redis7_client: redis.Redis, site: ShopSite
) -> None:
    redis7_client.flushall()
    f = frontier(redis7_client, "callbacks")
    bad = {
        f"{site.url}/product/{i}": name
        for i, name in enumerate(["_set_crawler", "start_requests", "spider_idle"], 1)
    }
    envs = [Envelope(url=url, callback=name, dont_filter=True) for url, name in bad.items()]
    envs.append(
        Envelope(
            url=f"{site.url}/product/4",
            errback="_set_crawler",
            callback="parse_item",
            dont_filter=True,
        )
    )
    envs.append(Envelope(url=f"{site.url}/product/5", callback="parse_item", dont_filter=True))
    assert f.push(envs).accepted == 5
    run = run_spider(
        "start_entries_spider.py", tmp_path, redis_url=redis7.url, crawl="callbacks"
    ).ok()
    assert [u for u, *_ in run.report["spider"]["seen"]] == [f"{site.url}/product/5"]
    assert site.hits() == {"/product/5": 1}
    dead = {d.url: d.error for d in f.dead()}
    assert set(dead) == {*bad, f"{site.url}/product/4"}
    for url, name in bad.items():
        assert name in dead[url] and "refused" in dead[url], dead[url]
    assert "Spider error" not in run.stderr
    c = f.counts()
    assert c.finished and c.conserved and c.dead == 4 and c.done == 1


class Rules(CrawlSpider):
    name = "rules"
    rules = (Rule(LinkExtractor(), callback="parse_page"),)

    def parse_page(self, response: Any) -> None: ...


class Maps(SitemapSpider):
    name = "maps"
    sitemap_urls = ["http://a.example/sitemap.xml"]


def test_generic_spiders_own_callbacks_still_travel() -> None:
    """CrawlSpider gives its rule links ``_callback``/``_errback`` and SitemapSpider its
    sitemaps ``_parse_sitemap``: allowed on spiders of those classes only."""
    rules = Rules()
    link = scrapy.Request(
        "http://a.example/p", callback=rules._callback, errback=rules._errback, meta={"rule": 0}
    )
    out = to_request(decode(encode(from_request(link, rules))), rules)
    assert out.callback == rules._callback and out.errback == rules._errback
    maps = Maps()
    sitemap = scrapy.Request("http://a.example/sitemap.xml", callback=maps._parse_sitemap)
    out = to_request(decode(encode(from_request(sitemap, maps))), maps)
    assert out.callback == maps._parse_sitemap
    plain = scrapy.Spider(name="plain")
    with pytest.raises(DecodeError, match="private"):
        to_request(Envelope(url="http://a.example/", callback="_callback"), plain)
    with pytest.raises(DecodeError, match="private"):
        to_request(Envelope(url="http://a.example/", callback="_parse_sitemap"), rules)


@pytest.mark.parametrize("name", FORBIDDEN)
def test_decode_refuses_and_encode_names_framework_methods(name: str) -> None:
    spider = Rules()
    with pytest.raises(DecodeError):
        to_request(Envelope(url="http://a.example/", callback=name), spider)
    method = getattr(spider, name, None)
    if callable(method) and hasattr(method, "__func__"):
        with pytest.raises(EncodeError, match="public method of your spider's own class"):
            from_request(scrapy.Request("http://a.example/", callback=method), spider)
