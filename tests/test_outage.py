"""Redis outages under a running worker (a real ``scrapy runspider`` on a real
redis-server of its own): Scrapy's reactor never waits on Redis, the crawl loses nothing
when Redis comes back, and a worker whose Redis does not come back exits with code 1 in
a bounded time (REDCRAWL_REDIS_OUTAGE_LIMIT).

The worker's reactor lateness is measured by ``outage_spider.StallProbe`` (a 20 ms
LoopingCall); the longest stall is printed (run with ``-s`` to see it)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from redcrawl.demo import ShopSite, SiteConfig
from tests.conftest import RedisServer, redis_binary
from tests.scrapy_projects.harness import Run, frontier, start_spider, wait_for

pytestmark = pytest.mark.slow


SITE = SiteConfig(
    products=300, per_page=10, categories=3, tracking_params=False, slow_every=1, slow_delay=0.1
)
"""331 pages, every product page 0.1 s: the crawl lasts well beyond the outage."""

WORKER = {
    "CONCURRENT_REQUESTS": 4,
    "REDCRAWL_LEASE_TTL": 60,
    "LOG_LEVEL": "INFO",
    # the outage tests need a worker that holds leases ahead (a polite worker leases only
    # what it can start now, so it holds nothing to go on with)
    "REDCRAWL_POLITENESS": "off",
}


class OwnRedis:
    """A redis-server of the test's own (it is frozen, killed and restarted), with an
    append-only file so that a restart on the same port keeps the crawl."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.server = RedisServer(
            redis_binary("7"), directory, persistence="aof", appendfsync="always"
        )
        self.port = self.server.port
        self.url = self.server.url

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=5)

    def kill(self) -> None:
        self.server.stop()

    def restart(self) -> None:
        """A new server on the same port, from the append-only file."""
        self.server.start()

    def stop(self) -> None:
        assert self.server.proc is not None
        if self.server.proc.poll() is None:
            os.kill(self.server.pid, signal.SIGCONT)
        self.kill()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    directory = tmp_path / "redis"
    directory.mkdir()
    server = OwnRedis(directory)
    try:
        yield server
    finally:
        server.stop()


def fetched(site: ShopSite) -> int:
    return len(site.hits())


def unfetched(site: ShopSite, own_redis: OwnRedis, crawl: str) -> int:
    """Requests leased to the worker and not fetched yet, at least: in flight minus the
    pages fetched but not acknowledged. The counts are read before the site's pages, so a
    fetch that ends in between can only make this smaller."""
    c = frontier(own_redis.client(), crawl).counts()
    return c.in_flight - (fetched(site) - c.done)


def max_stall(
    run: Run, since: float = 0.0, until: float = float("inf"), blocked: bool = False
) -> float:
    """The longest reactor stall (ms) between two wall-clock times (stalls under 50 ms
    are not recorded one by one: 50 if there was none longer). ``blocked``: only the
    part of each stall the reactor thread was not waiting for a CPU (the machine's
    load), i.e. blocked or busy in the worker itself."""
    stalls = [
        row[2 if blocked else 1]
        for row in run.stats.get("probe/stalls", [])
        if since <= row[0] <= until
    ]
    return max(stalls, default=50.0)


def check_nothing_lost(site: ShopSite, own_redis: OwnRedis, crawl: str) -> None:
    hits = site.hits()
    assert set(hits) == site.canonical_pages()  # every page fetched (at least once)
    c = frontier(own_redis.client(), crawl).counts()
    assert c.finished and c.conserved, c
    assert c.done == SITE.pages and c.dead == 0, c


def test_frozen_redis_stalls_nothing_and_loses_nothing(tmp_path: Path, own_redis: OwnRedis) -> None:
    """Redis frozen (SIGSTOP) for 30 s in the middle of a crawl: the worker goes on with
    what it holds, its reactor never stalls (measured), and when Redis thaws the crawl
    finishes with every page fetched and acknowledged."""
    with (
        ShopSite(SITE) as site,
        start_spider(
            "outage_spider.py",
            tmp_path,
            redis_url=own_redis.url,
            crawl="frozen",
            settings={**WORKER, "REDCRAWL_REDIS_OUTAGE_LIMIT": 90},
            args={"url": site.url + "/"},
        ) as worker,
    ):
        # freeze while the worker holds leased pages it has not fetched yet (a freeze
        # that lands while it waits for its next lease leaves it nothing to go on with)
        wait_for(
            lambda: fetched(site) >= 60 and unfetched(site, own_redis, "frozen") >= 8,
            timeout=60,
            what="60 pages, and 8 leased but not fetched",
        )
        os.kill(own_redis.server.pid, signal.SIGSTOP)
        frozen_at, during = time.time(), fetched(site)
        time.sleep(30)
        after = fetched(site)
        os.kill(own_redis.server.pid, signal.SIGCONT)
        thawed_at = time.time()
        run = worker.wait(timeout=240).ok()
        check_nothing_lost(site, own_redis, "frozen")
        assert max(site.hits().values()) == 1  # the leases outlived the outage
    stall = max_stall(run, frozen_at, thawed_at + 5)
    blocked = max_stall(run, frozen_at, thawed_at + 5, blocked=True)
    before = max_stall(run, 0, frozen_at)
    print(
        f"\nfrozen Redis 30 s: the worker fetched {after - during} pages during the "
        f"outage; longest reactor stall during it and 5 s after: {stall:.1f} ms, of "
        f"which {blocked:.1f} ms not waiting for a CPU (before it: {before:.1f} ms; "
        f"load average {os.getloadavg()[0]:.1f})"
    )
    assert after > during  # it went on downloading what it held
    assert blocked < 1000


def test_dead_redis_restarted_on_the_same_port_loses_nothing(
    tmp_path: Path, own_redis: OwnRedis
) -> None:
    """Redis killed, and started again 10 s later from its append-only file: the worker
    reconnects and the crawl finishes with nothing lost."""
    with (
        ShopSite(SITE) as site,
        start_spider(
            "outage_spider.py",
            tmp_path,
            redis_url=own_redis.url,
            crawl="dead",
            settings={**WORKER, "REDCRAWL_REDIS_OUTAGE_LIMIT": 60},
            args={"url": site.url + "/"},
        ) as worker,
    ):
        wait_for(lambda: fetched(site) >= 60, timeout=60, what="60 pages")
        own_redis.kill()
        killed_at = time.time()
        time.sleep(10)
        own_redis.restart()
        restarted_at = time.time()
        run = worker.wait(timeout=240).ok()
        check_nothing_lost(site, own_redis, "dead")
    stall = max_stall(run, killed_at, restarted_at + 5)
    blocked = max_stall(run, killed_at, restarted_at + 5, blocked=True)
    print(
        f"\nRedis dead for 10 s: longest reactor stall during it and 5 s after: "
        f"{stall:.1f} ms, of which {blocked:.1f} ms not waiting for a CPU "
        f"(load average {os.getloadavg()[0]:.1f})"
    )
    assert blocked < 1000


def test_redis_gone_for_good_exits_1_in_bounded_time(tmp_path: Path, own_redis: OwnRedis) -> None:
    """Redis killed and never back: the worker closes with reason redis_unavailable and
    exit code 1 soon after REDCRAWL_REDIS_OUTAGE_LIMIT (5 s here)."""
    with (
        ShopSite(SITE) as site,
        start_spider(
            "outage_spider.py",
            tmp_path,
            redis_url=own_redis.url,
            crawl="gone",
            settings={**WORKER, "REDCRAWL_REDIS_OUTAGE_LIMIT": 5},
            args={"url": site.url + "/"},
        ) as worker,
    ):
        wait_for(lambda: fetched(site) >= 30, timeout=60, what="30 pages")
        own_redis.kill()
        killed_at = time.monotonic()
        run = worker.wait(timeout=60)
        took = time.monotonic() - killed_at
    print(f"\nRedis gone: the worker exited {took:.1f} s later with code {run.returncode}")
    assert run.returncode == 1, run.tail()
    assert run.report["reason"] == "redis_unavailable"
    assert "Redis has not answered for" in run.stderr
    assert took < 5 + 20  # the limit, then the in-flight requests finish
