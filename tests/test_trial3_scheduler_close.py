"""Trial 3's review of the scheduler's close paths: a final round refused by Redis at a
graceful close is said, and Ctrl-C twice never waits on a Redis that froze right then.
A real Scheduler and Feeder (its I/O thread) against a real redis-server of the test's
own (filled to its maxmemory, or frozen with SIGSTOP); the reactor is not running, so
the scheduler's watchdog says nothing by itself."""

from __future__ import annotations

import logging
import os
import signal
import threading

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
from tests.conftest import RedisServer

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
    assert isinstance(scheduler, Scheduler)
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


def test_ctrl_c_twice_does_not_wait_on_a_redis_frozen_while_signing_off(
    redis7: RedisServer,
    redis7_client: redis.Redis,
    own_redis: OwnRedis,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Scrapy's forced shutdown: the feeder has given the requests back, then Redis
    freezes as the worker signs off (forget_worker). The shutdown ends anyway (the
    reactor is stopping and Scrapy ignores further Ctrl-C: a wait here is a hang until
    SIGKILL), and its line says the requests were given back. Here the sign-off's
    client is on a frozen server with redcrawl's retries (minutes)."""
    scheduler = _scheduler(redis7.url, redis7_client, "ctrlc")
    feeder = scheduler.feeder
    assert feeder is not None and scheduler.frontier is not None
    from redcrawl.connection import connect

    frozen = open_frontier(connect(Settings(redis_url=own_redis.url)), Settings(), "ctrlc")
    os.kill(own_redis.server.pid, signal.SIGSTOP)
    try:
        scheduler.frontier = frozen  # the feeder keeps its own (answering) frontier
        done = threading.Event()

        def shutdown() -> None:
            scheduler._on_forced_shutdown()
            done.set()

        with caplog.at_level(logging.INFO):
            threading.Thread(target=shutdown, daemon=True).start()
            assert done.wait(60), "the forced shutdown waited on the frozen Redis"
    finally:
        os.kill(own_redis.server.pid, signal.SIGCONT)
    told = [r.getMessage() for r in caplog.records if "forced shutdown" in r.getMessage()]
    assert len(told) == 1 and "given back" in told[0], told
