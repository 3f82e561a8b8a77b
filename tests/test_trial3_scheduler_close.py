"""Trial 3's review of the scheduler's close paths: a final round refused by Redis at a
graceful close is said, and Ctrl-C twice never waits on a Redis that froze right then.
A real Scheduler and Feeder (its I/O thread) against a real redis-server of the test's
own (filled to its maxmemory, or frozen with SIGSTOP); the reactor is not running, so
the scheduler's watchdog says nothing by itself."""

from __future__ import annotations

import logging

import pytest
import redis
from scrapy import Spider
from scrapy.utils.test import get_crawler

from redcrawl.codec import Envelope
from redcrawl.feeder import Feeder
from redcrawl.fingerprint import fingerprint
from redcrawl.frontier import open_frontier
from redcrawl.scrapy import Scheduler
from redcrawl.settings import Settings

from .test_outage import OwnRedis, own_redis  # noqa: F401 (a fixture)


def _scheduler(url: str, client: redis.Redis, crawl: str) -> Scheduler:
    """A Scheduler as open() leaves it, on ``client``'s frontier, its feeder running."""
    try:
        crawler = get_crawler(Spider, {"REDCRAWL_REDIS_URL": url})
    except RuntimeError:  # Scrapy 2.13's get_crawler wants an installed reactor
        from scrapy.utils.reactor import install_reactor

        install_reactor("twisted.internet.asyncioreactor.AsyncioSelectorReactor")
        crawler = get_crawler(Spider, {"REDCRAWL_REDIS_URL": url})
    scheduler = Scheduler.from_crawler(crawler)
    front = open_frontier(client, Settings(), crawl)
    scheduler.frontier = front
    scheduler.spider = Spider(name=crawl)
    scheduler.feeder = Feeder(front, scheduler.worker, tick=60.0, heartbeat=60.0)
    scheduler.feeder.start()
    assert scheduler.feeder.flush(wait=10.0)
    return scheduler


def test_a_final_round_refused_at_a_graceful_close_is_said(
    own_redis: OwnRedis,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Redis fills up (another program's keys) just as the worker closes: the last round
    (children to store, the heartbeat) is refused. The close says so, once, CRITICAL,
    naming out of memory. Seen before: the feeder's own line is DEBUG and the watchdog is
    stopped at close: nothing at all was said."""
    client = own_redis.client()
    scheduler = _scheduler(own_redis.url, client, "oomclose")
    assert scheduler.feeder is not None
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", int(client.info("memory")["used_memory"]) + 1_000_000)
    n = 0
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        while True:
            client.set(f"junk:{n}", b"x" * 10_000)
            n += 1
    url = "http://a.example/child"
    scheduler.feeder.store(Envelope(url=url, fingerprint=fingerprint(url)))
    with caplog.at_level(logging.DEBUG):
        scheduler.close("finished")
    told = [r for r in caplog.records if r.levelno >= logging.CRITICAL]
    assert len(told) == 1, [r.getMessage() for r in caplog.records]
    assert "out of memory" in told[0].getMessage(), told[0].getMessage()
