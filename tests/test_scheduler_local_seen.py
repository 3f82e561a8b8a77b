"""The scheduler answers ``enqueue_request`` without Redis for a request it leased: a real
Scrapy crawl in a subprocess (see tests/test_scheduler.py) on the demo shop and Redis 7."""

from __future__ import annotations

from pathlib import Path

import redis

from redcrawl.codec import Envelope
from redcrawl.demo import ShopSite, SiteConfig
from redcrawl.fingerprint import fingerprint
from tests.conftest import RedisServer
from tests.scrapy_projects.harness import frontier, run_spider

SMALL = SiteConfig(products=30, per_page=5, categories=3, tracking_params=False)


def test_a_leased_request_is_a_duplicate_without_asking_redis(
    tmp_path: Path, redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    with ShopSite(SMALL) as site:
        home = site.url + "/"
        # the home page stored by another worker: this one only leases it
        frontier(redis7_client, "leased").push([Envelope(url=home, fingerprint=fingerprint(home))])
        run = run_spider("shop_spider.py", tmp_path, redis_url=redis7.url, crawl="leased", args={})
        hits = site.hits()
        pages = site.canonical_pages()
    assert run.returncode == 0, run.tail()
    # every product page links home: the first link too is answered as a duplicate at
    # once (request_dropped), as for a request this worker stored itself; Redis filters
    # nothing this worker sends
    assert home in run.report["dropped"]
    assert run.stats.get("redcrawl/filtered_remote", 0) == 0
    assert run.stats["redcrawl/filtered"] == len(run.report["dropped"])
    assert hits == dict.fromkeys(pages, 1)
    c = frontier(redis7_client, "leased").counts()
    assert c.conserved and c.finished and c.done == len(pages)
