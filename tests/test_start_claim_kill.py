"""RedisSpider start entries survive a SIGKILL: a real ``scrapy crawl`` worker reads many
entries from its start key and is killed (frozen first) at a moment some entries are off
the key but not yet stored in the frontier; a second worker then finishes the crawl, and
every entry is fetched (counted at the test site): none is lost."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from redcrawl.demo import ShopSite, SiteConfig
from redcrawl.keys import start_claims
from tests.conftest import RedisServer
from tests.scrapy_projects.harness import frontier, start_spider

KEY = "start_claim:start_urls"
CRAWL = "start-claim-kill"
ENTRIES = 300


@pytest.fixture
def site() -> Iterator[ShopSite]:
    config = SiteConfig(products=ENTRIES, per_page=20, categories=2, tracking_params=False)
    with ShopSite(config) as s:
        yield s


@pytest.mark.parametrize("kind", ["list", "set", "zset"])
def test_start_entries_taken_by_a_killed_worker_are_all_fetched(
    tmp_path: Path, redis7: RedisServer, redis7_client: redis.Redis, site: ShopSite, kind: str
) -> None:
    redis7_client.flushall()
    paths = [f"/product/{i}" for i in range(1, ENTRIES + 1)]
    urls = [site.url + p for p in paths]
    settings = {
        "REDIS_START_URLS_BATCH_SIZE": "40",
        "REDCRAWL_MAX_IDLE_TIME": "8",
        "CONCURRENT_REQUESTS": "4",
    }
    if kind == "zset":
        redis7_client.zadd(KEY, {u: i for i, u in enumerate(urls)})
        settings["REDIS_START_URLS_AS_ZSET"] = "True"
        left = redis7_client.zcard
    elif kind == "set":
        redis7_client.sadd(KEY, *urls)
        settings["REDIS_START_URLS_AS_SET"] = "True"
        left = redis7_client.scard
    else:
        redis7_client.rpush(KEY, *urls)
        left = redis7_client.llen
    f = frontier(redis7_client, CRAWL)
    victim = start_spider(
        "start_claim_spider.py",
        tmp_path,
        redis_url=redis7.url,
        crawl=CRAWL,
        tag="victim",
        settings=settings,
    )
    with victim:
        # freeze the worker, look: entries off the key but not in the frontier? then kill
        deadline = time.monotonic() + 60
        # Between claim and frontier the window is short: after a while a claim not yet
        # cleared will do too (its entries may be stored: then they are fetched again).
        # CI once saw a worker finish all 300 entries without being caught in it.
        soft = time.monotonic() + 8
        while True:
            assert time.monotonic() < deadline, "never caught the worker between key and frontier"
            assert victim.proc.poll() is None, victim.output()[-3000:]
            victim.proc.send_signal(signal.SIGSTOP)
            time.sleep(0.05)
            taken = ENTRIES - int(left(KEY))
            stored = f.counts().accepted
            claimed = redis7_client.hlen(start_claims(KEY))
            if taken > stored or (claimed and time.monotonic() > soft):
                victim.proc.send_signal(signal.SIGKILL)
                victim.proc.wait()
                break
            victim.proc.send_signal(signal.SIGCONT)
            time.sleep(0.01)
    assert taken < ENTRIES, "the victim took every entry before the kill; the test proved little"
    finisher = start_spider(
        "start_claim_spider.py",
        tmp_path,
        redis_url=redis7.url,
        crawl=CRAWL,
        tag="finisher",
        settings=settings,
    )
    with finisher:
        run = finisher.wait(timeout=120)
    assert run.returncode == 0, run.tail()
    hits = site.hits()
    missing = [p for p in paths if not hits.get(p)]
    assert not missing, (
        f"{len(missing)} start entries were never fetched (taken {taken}, stored {stored} at "
        f"the kill): {missing[:10]}"
    )
    # the victim's claim went back to the key and was read again
    assert run.stats.get("redcrawl/start_entries/recovered", 0) >= taken - stored, run.tail()
    assert not redis7_client.exists(KEY)
    assert not redis7_client.exists(start_claims(KEY)), "a claim was left behind"
