"""Trial 3's review of the RedisSpider start key calls made on Scrapy's reactor: each must
use the spider's bounded client (5 s at most, no retry), never the scheduler's client
(redcrawl's retries: minutes while Redis is frozen), and a frozen Redis must not make
the reactor wait again and again. A real redis-server of the test's own, frozen with
SIGSTOP; the spider built in-process (its scheduler's feeder and frontier set by hand)."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterator
from typing import Any, cast

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from scrapy.utils.test import get_crawler

from redcrawl.feeder import Feeder
from redcrawl.frontier import open_frontier
from redcrawl.scrapy import RedisSpider
from redcrawl.scrapy.spiders import StartKey
from redcrawl.settings import Settings
from tests.conftest import RedisServer

from .test_outage import OwnRedis, own_redis  # noqa: F401 (a fixture)

KEY = "shop:start_urls"
ENTRIES = [f"http://a.example/{i}" for i in range(4)]


def _texts(raw: Any) -> list[str]:
    return [e.decode() for e in raw]


class Shop(RedisSpider):
    name = "shop"


def _spider(url: str) -> Shop:
    try:
        crawler = get_crawler(Shop, {"REDCRAWL_REDIS_URL": url})
    except RuntimeError:  # Scrapy 2.13's get_crawler wants an installed reactor
        from scrapy.utils.reactor import install_reactor

        install_reactor("twisted.internet.asyncioreactor.AsyncioSelectorReactor")
        crawler = get_crawler(Shop, {"REDCRAWL_REDIS_URL": url})
    return cast(Shop, Shop.from_crawler(crawler))


def _claiming(spider: Shop, client: redis.Redis, crawl: str) -> Feeder:
    """The spider as its scheduler makes it (claims, worker w1), on ``client``'s frontier."""
    front = open_frontier(client, Settings(), crawl)
    feeder = Feeder(front, "w1", tick=60.0, heartbeat=60.0)  # not started
    spider._feeder, spider._worker, spider._frontier = feeder, "w1", front
    return feeder


@pytest.fixture
def frozen(own_redis: OwnRedis) -> Iterator[OwnRedis]:  # noqa: F811
    """``own_redis`` frozen (SIGSTOP) by the test with :func:`freeze`, thawed after it."""
    yield own_redis
    os.kill(own_redis.server.pid, signal.SIGCONT)


def freeze(server: OwnRedis) -> None:
    os.kill(server.server.pid, signal.SIGSTOP)


def test_recovering_claims_reads_heartbeats_with_the_bounded_client(
    redis7: RedisServer,
    redis7_client: redis.Redis,
    frozen: OwnRedis,
) -> None:
    """``recover_claims`` (on the reactor) reads the workers' heartbeats and the server's
    clock with the spider's bounded client. Here the scheduler's frontier client is on
    a frozen server, with a 1 s reply timeout and no retry (a real worker's has 5
    retries of 30 s): the reads must not go through it. Seen before: they did (after
    owners() on the bounded client), so a Redis frozen between the two blocked the
    reactor for minutes."""
    spider = _spider(redis7.url)
    elsewhere = redis.Redis(port=frozen.port, socket_timeout=1, retry=Retry(NoBackoff(), 0))
    _claiming(spider, elsewhere, "hb")
    redis7_client.rpush(KEY, *ENTRIES)
    assert len(StartKey(redis7_client, KEY, "list").claim("w-gone#1", 3)) == 3
    freeze(frozen)  # the scheduler's client would wait here

    assert spider.recover_claims(force=True) == 3  # w-gone has no heartbeat: back

    assert sorted(_texts(redis7_client.lrange(KEY, 0, -1))) == ENTRIES


def test_settling_claims_while_redis_is_frozen_waits_once_and_says_so_once(
    redis7_client: redis.Redis,
    frozen: OwnRedis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A batch stored just before Redis froze: its claim can't be cleared. The first
    attempt waits (5 s at most), the next ones (every 0.5 s on the reactor) are skipped
    until Redis can be read again, and the failure is logged once. Seen before: each
    attempt blocked the reactor 5 s and logged "Could not clear a start entries claim
    yet"."""
    spider = _spider(frozen.url)
    _claiming(spider, redis7_client, "settle")
    client = frozen.client()
    client.rpush(KEY, *ENTRIES)
    assert len(StartKey(client, KEY, "list").claim("w1#1", 2)) == 2
    spider._closing = True  # no callLater: the test makes each attempt itself
    spider._pending.append(("w1#1", 0, []))  # generation 0: stored
    freeze(frozen)
    with caplog.at_level(logging.INFO):
        for _ in range(3):
            spider._settle_claims()
    told = [r for r in caplog.records if "claim" in r.getMessage() and r.levelno >= 30]
    assert len(told) == 1, [r.getMessage() for r in caplog.records]
    assert len(spider._pending) == 1  # still to clear once Redis answers


def test_closing_gives_back_a_claim_whose_reply_never_came(
    redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    """A claim sent, its reply lost (the spider keeps its field to send it again at the
    next read), then the spider closes: the claim goes back to the key at close. Seen
    before: it stayed claimed until another worker's recover pass (none, if this was the
    last worker)."""
    spider = _spider(redis7.url)
    _claiming(spider, redis7_client, "close")
    redis7_client.rpush(KEY, *ENTRIES)
    assert len(StartKey(redis7_client, KEY, "list").claim("w1#1", 3)) == 3
    spider._retry_field = "w1#1"  # as _take leaves it when the reply never came

    spider._spider_closed(spider, "finished")

    assert _texts(redis7_client.lrange(KEY, 0, -1)) == ENTRIES
    assert redis7_client.hlen(StartKey(redis7_client, KEY, "list").claims) == 0
