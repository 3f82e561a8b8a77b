"""Bugs found in trial 7 by using redcrawl as a stranger would, following the docs
literally: a migrated scrapy-redis project (``SCHEDULER_PERSIST = False``) run with
``redcrawl crawl -w N`` on a real redis-server, against the demo shop site. Each test
says what was seen before the fix."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import redis

from redcrawl.demo import ShopSite, SiteConfig
from redcrawl.redis_server import RedisServer
from tests.scrapy_projects.harness import frontier
from tests.test_workers import cli_env

pytestmark = pytest.mark.slow

SITE = SiteConfig(products=6, per_page=3, categories=1, tracking_params=False)

# A spider whose worker w1 of `redcrawl crawl` is slow to start (a heavy import, a slow
# machine): the other worker crawls the whole small site before w1 says a word.
LATE_SPIDER = """
import os
import time

import scrapy


class LateSpider(scrapy.Spider):
    name = "late"

    def __init__(self, url=None, **kwargs):
        super().__init__(**kwargs)
        self.start_urls = [url]
        if os.environ.get("REDCRAWL_WORKER_ID", "").endswith(":w1"):
            time.sleep(float(os.environ.get("T7_LATE", "6")))

    def parse(self, response):
        for href in response.css("a::attr(href)").getall():
            yield response.follow(href, callback=self.parse)
"""


def _crawl(
    tmp_path: Path, url: str, crawl: str, redis_url: str, *extra: str, timeout: float = 120
) -> subprocess.CompletedProcess[bytes]:
    spider = tmp_path / "t7_late_spider.py"
    spider.write_text(textwrap.dedent(LATE_SPIDER))
    cmd = [
        sys.executable,
        "-m",
        "redcrawl.cli",
        "crawl",
        str(spider),
        "-w",
        "2",
        "--crawl",
        crawl,
        "--arg",
        f"url={url}",
        "--set",
        "SCHEDULER_PERSIST=False",
        "--set",
        "REDCRAWL_POLITENESS=off",
        "--no-progress",
        *extra,
    ]
    env = {**cli_env(redis_url), "COLUMNS": "400"}
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, timeout=timeout)


def test_persist_off_crawl_is_not_fetched_again_by_a_worker_that_starts_late(
    tmp_path: Path, redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    """`redcrawl crawl -w 2` of a persist-off crawl whose worker w1 starts late: w0
    crawls the small site, finds no other live worker, removes the crawl's state and
    exits; then w1 starts, its start URL is new to the empty crawl, and it fetches the
    whole site a second time. Seen in trial 7 (no sleep needed: 1 run of 6 with 3
    workers on a 12-page site fetched every page twice, each worker's stats
    `downloader/response_count: 12`). The workers of one command are one fleet: none of
    them may remove the crawl under another that has not started yet."""
    with ShopSite(SITE) as site:
        done = _crawl(tmp_path, site.url + "/", "t7late", redis7.url)
        hits = site.hits()
    out = done.stdout.decode() + done.stderr.decode()
    assert done.returncode == 0, out[-3000:]
    assert hits == dict.fromkeys(site.canonical_pages(), 1), hits
    # and it is still removed at the end, as the docs say, its counts reported
    assert frontier(redis7_client, "t7late").counts().accepted == 0
    assert "SCHEDULER_PERSIST is off" in out, out[-3000:]
    [accepted] = [line for line in out.splitlines() if "│ accepted" in line]
    assert int(accepted.split("│")[2].strip()) == len(site.canonical_pages()), accepted
    assert os.path.isdir(tmp_path / ".redcrawl" / "logs" / "t7late")


def test_purge_if_finished_removes_a_finished_crawl_once_after_its_last_worker(
    redis7_client: redis.Redis,
) -> None:
    """The removal both the workers of `scrapy crawl` and the command use: not while
    another worker's heartbeat is current, not an unfinished crawl, and a second call
    (two workers closing together: each signs off, then calls it under the purge lock)
    does not overwrite the counts the first one left with the empty crawl's zeros."""
    from redcrawl.codec import Envelope
    from redcrawl.fingerprint import fingerprint
    from redcrawl.frontier.final import purge_if_finished, read_final

    f = frontier(redis7_client, "t7once")
    urls = [f"http://127.0.0.1:9/p{i}" for i in range(3)]
    f.push([Envelope(url=u, fingerprint=fingerprint(u)) for u in urls])
    f.renew("a", ttl=60)
    f.renew("b", ttl=60)
    f.ack(f.lease("a", 2))
    assert purge_if_finished(f) is None  # live workers
    f.forget_worker("a")
    f.forget_worker("b")
    assert purge_if_finished(f) is None  # unfinished: one ready
    f.ack(f.lease("b", 5))
    f.renew("b", ttl=60)
    assert purge_if_finished(f, exclude="a") is None  # b is alive
    purged = purge_if_finished(f, exclude="b")  # b itself, closing
    assert purged is not None and purged[0].done == 3 and purged[1] is None
    assert f.counts().accepted == 0
    assert purge_if_finished(f) is None  # nothing left to remove: the counts stay
    final = read_final(redis7_client, f.keys)
    assert final is not None and final[0].done == 3 and final[0].accepted == 3


def test_status_of_a_crawl_removed_at_its_end_says_so_with_its_counts(
    tmp_path: Path, redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    """After a persist-off crawl (`scrapy crawl`, or `redcrawl crawl`), the README's next
    step, `redcrawl status`, said only `error: no crawl named 'shop' in ...; it holds no
    crawl`, as for a typo, while its counts were kept a day (`rc:{shop}:final`). It is
    still no crawl (exit 1, as the API's 404), but the line says it finished and was
    removed, with those counts; `dead` too (its dead letters went with it)."""
    from redcrawl.codec import Envelope
    from redcrawl.fingerprint import fingerprint
    from redcrawl.frontier.final import purge_if_finished

    f = frontier(redis7_client, "t7gone")
    urls = [f"http://127.0.0.1:9/p{i}" for i in range(3)]
    f.push([Envelope(url=u, fingerprint=fingerprint(u)) for u in urls])
    a, b, c = f.lease("w", 3)
    f.ack([a, b])
    assert f.nack(c, "HTTP 500", retry=False) == "dead"
    f.forget_worker("w")
    assert purge_if_finished(f) is not None
    env = cli_env(redis7.url)
    for command in ("status", "dead"):
        done = subprocess.run(
            [sys.executable, "-m", "redcrawl.cli", command, "--crawl", "t7gone"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            timeout=60,
        )
        out = done.stdout.decode() + done.stderr.decode()
        assert done.returncode == 1, out
        assert "no crawl named 't7gone'" in out, out
        assert "SCHEDULER_PERSIST" in out and "2 done, 1 dead" in out, out
    # a typo is said as before
    done = subprocess.run(
        [sys.executable, "-m", "redcrawl.cli", "status", "--crawl", "t7typo"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        timeout=60,
    )
    out = done.stdout.decode() + done.stderr.decode()
    assert done.returncode == 1 and "SCHEDULER_PERSIST" not in out, out
