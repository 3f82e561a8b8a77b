"""Scrapy's one-off commands in a project switched to redcrawl (``redcrawl.scrapy.one_off``).

A user of a redcrawl project runs ``scrapy shell URL``, ``scrapy fetch URL``, ``scrapy
parse --spider NAME URL`` and ``scrapy check`` the way they did before. Seen before: each
stopped with ``unstorable_request`` (``fetch`` exited 1 printing nothing; ``shell`` then
waited forever), and, had they got further, they would have leased the crawl's requests
and taken a RedisSpider's start URLs off its key. Now each does what it does on a plain
project, and the crawl in Redis is left exactly as it was (every key's DUMP compared), its
site seeing only the page asked for.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis

from redcrawl.codec import Envelope
from redcrawl.demo import ShopSite, SiteConfig
from redcrawl.fingerprint import fingerprint
from redcrawl.redis_server import RedisServer
from redcrawl.scrapy.one_off import one_off_command
from tests.scrapy_projects.harness import clean_env, frontier

pytestmark = pytest.mark.slow

SPIDERS = '''
import scrapy
from redcrawl.scrapy import RedisSpider


class ShopSpider(scrapy.Spider):
    name = "shop"
    start_urls = ["{root}/"]

    def parse(self, response):
        """@url {root}/category/1
        @returns requests 1
        @returns items 1 1
        """
        for href in response.css("a::attr(href)").getall():
            yield response.follow(href, self.parse)
        yield {{"url": response.url}}


class StartsSpider(RedisSpider):
    name = "starts"
    redis_key = "starts:urls"

    def parse(self, response):
        yield {{"url": response.url}}
'''


def _project(tmp_path: Path, root: str, redis_url: str) -> Path:
    project = tmp_path / "project"
    spiders = project / "shopproj" / "spiders"
    spiders.mkdir(parents=True)
    (project / "scrapy.cfg").write_text("[settings]\ndefault = shopproj.settings\n")
    (project / "shopproj" / "__init__.py").write_text("")
    (spiders / "__init__.py").write_text("")
    (spiders / "shop.py").write_text(SPIDERS.format(root=root))
    (project / "shopproj" / "settings.py").write_text(
        'BOT_NAME = "shopproj"\n'
        'SPIDER_MODULES = ["shopproj.spiders"]\n'
        'SCHEDULER = "redcrawl.scrapy.Scheduler"\n'
        'DUPEFILTER_CLASS = "redcrawl.scrapy.DupeFilter"\n'
        f'REDIS_URL = "{redis_url}"\n'
        "TELNETCONSOLE_ENABLED = False\n"
        "ROBOTSTXT_OBEY = True\n"  # (Scrapy's own middleware obeys it in these commands)
        'DOWNLOADER_MIDDLEWARES = {"redcrawl.scrapy.RobotsTxtMiddleware": 100}\n'
    )
    return project


def _scrapy(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "scrapy", *args],
        cwd=project,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=90,
    )


def _keyspace(client: redis.Redis) -> dict[Any, Any]:
    return {key: client.dump(key) for key in client.keys("*")}


def test_shell_fetch_parse_and_check_leave_the_crawl_in_redis_alone(
    tmp_path: Path, redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    config = SiteConfig(products=20, per_page=5, categories=2, tracking_params=False)
    with ShopSite(config) as site:
        root = site.url
        project = _project(tmp_path, root, redis7.url)
        # the crawl of the project's spider, half done, and a RedisSpider's start URLs
        urls = [f"{root}/product/{i}" for i in range(1, 9)]
        crawl = frontier(redis7_client, "shop")
        crawl.push([Envelope(url=u, fingerprint=fingerprint(u)) for u in urls])
        crawl.ack(crawl.lease("w-earlier", 3))
        redis7_client.hdel(crawl.keys.workers, "w-earlier")
        redis7_client.rpush("starts:urls", f"{root}/product/11", f"{root}/product/12")
        before = _keyspace(redis7_client)
        counts = crawl.counts()
        assert counts.ready == 5 and counts.done == 3, counts

        fetched = _scrapy(project, "fetch", "--nolog", f"{root}/product/3")
        assert fetched.returncode == 0, fetched.stderr[-3000:]
        assert 'data-product-id="3"' in fetched.stdout, fetched.stdout[-3000:]

        shell = _scrapy(project, "shell", f"{root}/category/2", "-c", "response.status")
        assert shell.returncode == 0, shell.stderr[-3000:]
        assert shell.stdout.strip() == "200", shell.stdout
        assert "`scrapy shell` runs its requests in this process only" in shell.stderr

        parsed = _scrapy(project, "parse", "--spider", "shop", f"{root}/category/1")
        assert parsed.returncode == 0, parsed.stderr[-3000:]
        assert f"{root}/category/1" in parsed.stdout and "Requests" in parsed.stdout

        from_redis_spider = _scrapy(project, "parse", "--spider", "starts", f"{root}/product/5")
        assert from_redis_spider.returncode == 0, from_redis_spider.stderr[-3000:]
        assert f"{root}/product/5" in from_redis_spider.stdout, from_redis_spider.stdout

        checked = _scrapy(project, "check", "shop")
        assert checked.returncode == 0, checked.stdout + checked.stderr[-3000:]
        assert "OK" in checked.stdout + checked.stderr

        # only the pages asked for: none of the crawl's, none of the start URLs
        assert site.hits() == {
            "/product/3": 1,
            "/category/2?page=1": 1,  # (as the site counts a category's first page)
            "/category/1?page=1": 2,  # parse, then check's @url
            "/product/5": 1,
            "/robots.txt": 5,  # once per command, by Scrapy's RobotsTxtMiddleware
        }, site.hits()
    assert _keyspace(redis7_client) == before
    assert redis7_client.lrange("starts:urls", 0, -1) == [
        f"{root}/product/11".encode(),
        f"{root}/product/12".encode(),
    ]


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["/usr/bin/python3.11", "/venv/bin/scrapy", "shell", "http://x/"], "shell"),
        (["python", "-m", "scrapy", "fetch", "--nolog", "http://x/"], "fetch"),
        (["python", "-u", "-X", "dev", "-m", "scrapy", "parse", "--spider", "s", "u"], "parse"),
        (["python", "-mscrapy", "check"], "check"),
        (["python", "/site-packages/scrapy/__main__.py", "view", "http://x/"], "view"),
        (["python", "/venv/bin/scrapy", "crawl", "shop", "-a", "mode=shell"], None),
        (["python", "/venv/bin/scrapy", "runspider", "fetch.py"], None),
        (["python", "/venv/bin/scrapy", "--help"], None),
        (["python", "run.py", "scrapy", "shell"], None),  # a script of the user's
        (["python", "-c", "import scrapy", "shell"], None),
        (["python", "-m", "scrapyd.runner", "crawl", "shop"], None),
        (["python"], None),
    ],
)
def test_one_off_command_reads_scrapys_command_line(argv: list[str], command: str | None) -> None:
    assert one_off_command(argv) == command
