"""RedisSpider start entries against a real Redis and real crawls: one behaviour whether
an entry is read at start or while idle (always fetched, as in scrapy-redis), lists, sets
and sorted sets, only http(s) unless the spider opts in, one callback rule, and clear
errors for a start key of the wrong type or outside an ACL user's key pattern."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import scrapy
from scrapy.utils.test import get_crawler

from redcrawl.demo import ShopSite, SiteConfig
from redcrawl.errors import ConfigError
from redcrawl.scrapy import RedisSpider
from tests.conftest import RedisServer
from tests.scrapy_projects.harness import run_spider

KEY = "start_entries:start_urls"


@pytest.fixture
def site() -> Iterator[ShopSite]:
    with ShopSite(SiteConfig(products=6, per_page=3, categories=2, tracking_params=False)) as s:
        yield s


def crawl(tmp_path: Path, redis7: RedisServer, tag: str = "run", **settings: Any) -> Any:
    args = settings.pop("args", {})
    return run_spider(
        "start_entries_spider.py",
        tmp_path,
        redis_url=redis7.url,
        crawl="start-entries",
        tag=tag,
        settings=settings,
        args=args,
    )


def seen(run: Any) -> list[list[Any]]:
    return list(run.report["spider"]["seen"])


def test_entries_read_at_start_and_when_idle_are_both_always_fetched(
    tmp_path: Path, redis7: RedisServer, redis7_client: redis.Redis, site: ShopSite
) -> None:
    """The same entry, twice at start and once more while idle: fetched three times,
    though the site is not in allowed_domains; a link it yields is dropped as offsite."""
    redis7_client.flushall()
    home = site.url + "/"
    redis7_client.rpush(KEY, home, json.dumps({"url": home, "meta": {"source": "json"}}))
    run = crawl(
        tmp_path, redis7, args={"idle_url": home, "offsite_link": site.url + "/product/1"}
    ).ok()
    got = seen(run)
    assert [u for u, *_ in got] == [home] * 3, got
    assert all(dont_filter for _, _, dont_filter, _ in got), got
    assert sorted(str(s) for _, s, _, _ in got) == ["None", "None", "json"]
    assert site.hits() == {"/": 3}  # /product/1 is offsite: never fetched
    assert run.stats["redcrawl/start_entries/accepted"] == 3
    assert run.stats.get("offsite/filtered", 0) >= 1
    assert redis7_client.llen(KEY) == 0


def test_only_http_entries_unless_the_spider_opts_in(
    tmp_path: Path, redis7: RedisServer, redis7_client: redis.Redis, site: ShopSite
) -> None:
    redis7_client.flushall()
    secret = tmp_path / "secret.txt"
    secret.write_text("local file")
    redis7_client.rpush(
        KEY,
        f"file://{secret}",
        "data:text/plain,hello",
        "ftp://127.0.0.1:1/x",
        "s3://bucket/key",
        "http://exa mple.com/",
        json.dumps({"url": site.url + "/product/2", "callback": "_set_crawler"}),
        json.dumps({"url": site.url + "/product/3", "callback": "start_requests"}),
        json.dumps({"url": site.url + "/product/4", "callback": "spider_idle"}),
        json.dumps({"url": site.url + "/product/5", "callback": "parse_item"}),
    )
    run = crawl(tmp_path, redis7).ok()
    assert [(u, cb) for u, _, _, cb in seen(run)] == [(site.url + "/product/5", "parse_item")]
    assert site.hits() == {"/product/5": 1}
    assert run.stats["redcrawl/start_entries/refused"] == 8
    for text in (
        "file://",
        "data:",
        "ftp://",
        "s3://",
        "exa mple.com",
        "_set_crawler",
        "start_requests",
        "spider_idle",
    ):
        assert text in run.stderr, text
    assert "Spider error" not in run.stderr and "Traceback" not in run.stderr
    # where the refused entries are, with the redis-cli command for this crawl's Redis
    assert f"`redis-cli -u {redis7.url} LRANGE " in run.stderr, run.stderr[-3000:]


class Shop(RedisSpider):
    name = "shop"

    def parse_item(self, response: Any) -> None: ...


def crawler_for(spidercls: type, settings: dict[str, Any]) -> Any:
    try:
        return get_crawler(spidercls, settings)
    except RuntimeError:  # Scrapy 2.13's get_crawler wants an installed reactor
        from scrapy.utils.reactor import install_reactor

        install_reactor("twisted.internet.asyncioreactor.AsyncioSelectorReactor")
        return get_crawler(spidercls, settings)


def spider_on(redis_url: str, **settings: Any) -> Shop:
    crawler = crawler_for(Shop, {"REDCRAWL_REDIS_URL": redis_url, **settings})
    spider = Shop.from_crawler(crawler)
    assert isinstance(spider, Shop)
    return spider


def test_opted_in_schemes_are_accepted(redis7: RedisServer, redis7_client: redis.Redis) -> None:
    redis7_client.flushall()

    class Ftp(Shop):
        redis_start_url_schemes = {"http", "https", "ftp"}

    crawler = crawler_for(Ftp, {"REDCRAWL_REDIS_URL": redis7.url})
    spider = Ftp.from_crawler(crawler)
    redis7_client.rpush("shop:start_urls", "ftp://files.example.com/a", "file:///etc/passwd")
    assert [r.url for r in spider.next_requests()] == ["ftp://files.example.com/a"]
    assert crawler.stats.get_value("redcrawl/start_entries/refused") == 1


@pytest.mark.parametrize(
    ("settings", "write"),
    [
        (
            {"REDIS_START_URLS_AS_ZSET": True},
            lambda c: c.zadd(
                "shop:start_urls", {"http://a.example/low": 1, "http://a.example/high": 9}
            ),
        ),
        (
            {"REDIS_START_URLS_AS_SET": True},
            lambda c: c.sadd("shop:start_urls", "http://a.example/low", "http://a.example/high"),
        ),
        ({}, lambda c: c.rpush("shop:start_urls", "http://a.example/high", "http://a.example/low")),
    ],
)
def test_list_set_and_sorted_set_keys(
    redis7: RedisServer, redis7_client: redis.Redis, settings: dict[str, Any], write: Any
) -> None:
    redis7_client.flushall()
    write(redis7_client)
    spider = spider_on(redis7.url, **settings)
    urls = [r.url for r in spider.next_requests()]
    if "REDIS_START_URLS_AS_SET" in settings:
        urls.sort()
    assert urls == ["http://a.example/high", "http://a.example/low"]
    assert not redis7_client.exists("shop:start_urls")
    assert list(spider.next_requests()) == []


def test_sorted_set_start_key_in_a_real_crawl(
    tmp_path: Path, redis7: RedisServer, redis7_client: redis.Redis, site: ShopSite
) -> None:
    redis7_client.flushall()
    redis7_client.zadd(KEY, {site.url + f"/product/{i}": i for i in (1, 2, 3)})
    run = crawl(tmp_path, redis7, REDIS_START_URLS_AS_ZSET="True").ok()
    assert sorted(u for u, *_ in seen(run)) == [site.url + f"/product/{i}" for i in (1, 2, 3)]
    assert not redis7_client.exists(KEY)


@pytest.mark.parametrize(
    ("settings", "write", "words"),
    [
        (
            {},
            lambda c: c.zadd("shop:start_urls", {"http://a.example/": 1}),
            ["'shop:start_urls'", "zset", "REDIS_START_URLS_AS_ZSET = True"],
        ),
        (
            {"REDIS_START_URLS_AS_ZSET": True},
            lambda c: c.rpush("shop:start_urls", "http://a/"),
            ["'shop:start_urls'", "list", "REDIS_START_URLS_AS_ZSET"],
        ),
        (
            {"REDIS_START_URLS_AS_SET": True},
            lambda c: c.set("shop:start_urls", "x"),
            ["'shop:start_urls'", "string", "REDIS_START_URLS_AS_SET"],
        ),
    ],
)
def test_start_key_of_the_wrong_type_is_a_clear_error(
    redis7: RedisServer,
    redis7_client: redis.Redis,
    settings: dict[str, Any],
    write: Any,
    words: list[str],
) -> None:
    redis7_client.flushall()
    write(redis7_client)
    spider = spider_on(redis7.url, **settings)
    with pytest.raises(ConfigError) as info:
        spider.fetch_data(16)
    for word in words:
        assert word in str(info.value)


def test_wrong_type_closes_a_real_crawl_with_the_reason(
    tmp_path: Path, redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    redis7_client.flushall()
    redis7_client.zadd(KEY, {"http://a.example/": 1})
    run = crawl(tmp_path, redis7)
    assert run.report["reason"] == "redcrawl_start_key", run.tail()
    assert run.returncode == 1, run.tail()  # never exit 0 on a crawl that did not run
    assert "REDIS_START_URLS_AS_ZSET = True" in run.stderr
    assert "Traceback" not in run.stderr


def test_start_key_outside_the_acl_key_pattern_names_key_and_pattern(
    redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    redis7_client.flushall()
    redis7_client.execute_command(
        "ACL", "SETUSER", "rcstart", "on", ">pw", "~rc:*", "+@all", "-@dangerous"
    )
    try:
        spider = Shop()
        spider.server = redis.Redis.from_url(redis7.url, username="rcstart", password="pw")
        spider.redis_key = "shop:start_urls"
        spider._key_type = "list"
        with pytest.raises(ConfigError) as info:
            spider.fetch_data(16)
        message = str(info.value)
        assert "'shop:start_urls'" in message and "~shop:start_urls" in message
        assert "rc:%(name)s:start_urls" in message
        spider.redis_key = "rc:shop:start_urls"  # inside the pattern: fine
        assert spider.fetch_data(16) == []
    finally:
        redis7_client.execute_command("ACL", "DELUSER", "rcstart")


def test_json_entry_callbacks_follow_the_one_rule() -> None:
    spider = Shop()
    ok = spider.make_request_from_data(
        json.dumps({"url": "http://a.example/", "callback": "parse_item"}).encode()
    )
    assert isinstance(ok, scrapy.Request) and ok.callback == spider.parse_item
    for name in (
        "_set_crawler",
        "start_requests",
        "spider_idle",
        "closed",
        "from_crawler",
        "nope",
        "name",
    ):
        with pytest.raises(ValueError, match="own class"):
            spider.make_request_from_data(
                json.dumps({"url": "http://a.example/", "callback": name}).encode()
            )
