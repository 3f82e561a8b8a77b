"""RedisSpider start entries are claimed, not popped, against a real Redis: a batch moves
atomically from the start key (list, set or sorted set) into the claims hash beside it,
in the same cluster slot; a stopped worker's claims go back (a list's in order, a sorted
set's with their scores), a live worker's never; refused entries are kept in a capped
list beside the key. The SIGKILL test of the whole path: tests/test_start_claim_kill.py."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import msgpack
import pytest
import redis
from redis.crc import key_slot
from scrapy.utils.test import get_crawler

from redcrawl.codec import Envelope
from redcrawl.demo import ShopSite, SiteConfig
from redcrawl.errors import ConfigError
from redcrawl.feeder import Feeder
from redcrawl.fingerprint import fingerprint
from redcrawl.frontier import open_frontier
from redcrawl.keys import start_claims, start_refused
from redcrawl.redis_server import LocalCluster
from redcrawl.scrapy import RedisSpider, spiders
from redcrawl.scrapy.spiders import StartKey
from redcrawl.settings import Settings
from tests import cluster
from tests.conftest import RedisServer
from tests.proxykit import ReplyDropper
from tests.scrapy_projects.harness import run_spider

KEY = "shop:start_urls"


# --- key names --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("key", "claims"),
    [
        ("shop:start_urls", "shop:start_urls:{shop:start_urls}:claimed"),
        ("rc:shop:start_urls", "rc:shop:start_urls:{rc:shop:start_urls}:claimed"),
        ("rc:{shop}:start_urls", "rc:{shop}:start_urls:claimed"),  # its tag is kept
        ("x}{y}:s", "x}{y}:s:claimed"),  # a tag after a stray '}' is still a tag
        ("a{b", "{a{b}:claimed"),  # a '{' without a tag: the name is the tag
    ],
)
def test_keys_beside_the_start_key_share_its_cluster_slot(key: str, claims: str) -> None:
    assert start_claims(key) == claims
    assert start_refused(key) == claims.removesuffix("claimed") + "refused"
    slot = key_slot(key.encode())
    assert key_slot(start_claims(key).encode()) == slot
    assert key_slot(start_refused(key).encode()) == slot


@pytest.mark.parametrize("key", ["a{}b", "a}b", ""])
def test_a_start_key_no_key_can_share_a_slot_with_is_a_clear_error(key: str) -> None:
    with pytest.raises(ConfigError, match="REDIS_START_URLS_KEY"):
        start_claims(key)


# --- claim and recover ------------------------------------------------------------------
def claimed(client: redis.Redis, field: str) -> list[Any]:
    packed = client.hget(start_claims(KEY), field)
    return list(msgpack.unpackb(packed, raw=True)) if packed else []


def test_list_claim_takes_from_the_head_and_recover_restores_the_order(
    redis_client: redis.Redis,
) -> None:
    entries = [f"http://a.example/{i}".encode() for i in range(5)] + [b"\xff\x00 raw"]
    redis_client.rpush(KEY, *entries)
    key = StartKey(redis_client, KEY, "list")
    assert key.claim("w1#1", 2) == entries[:2]
    assert key.claim("w1#2", 2) == entries[2:4]
    assert redis_client.lrange(KEY, 0, -1) == entries[4:]
    assert claimed(redis_client, "w1#1") == entries[:2]
    assert key.owners() == {"w1": ["w1#2", "w1#1"]}  # newest first
    assert key.recover(["w1#2", "w1#1"]) == 4
    assert redis_client.lrange(KEY, 0, -1) == entries  # as if never taken
    assert not redis_client.exists(start_claims(KEY))
    assert key.recover(["w1#2"]) == 0  # given back already: nothing twice


def test_set_claim_and_recover(redis_client: redis.Redis) -> None:
    entries = {f"http://a.example/{i}".encode() for i in range(5)}
    redis_client.sadd(KEY, *entries)
    key = StartKey(redis_client, KEY, "set")
    got = key.claim("w1#1", 3)
    assert len(set(got)) == 3 and set(got) <= entries
    assert redis_client.smembers(KEY) == entries - set(got)
    assert set(claimed(redis_client, "w1#1")) == set(got)
    assert key.recover(["w1#1"]) == 3
    assert redis_client.smembers(KEY) == entries


def test_sorted_set_claim_takes_the_highest_and_recover_keeps_scores(
    redis_client: redis.Redis,
) -> None:
    scores = {f"http://a.example/{i}": float(i) for i in range(5)}
    scores["http://a.example/half"] = 2.5
    redis_client.zadd(KEY, scores)
    key = StartKey(redis_client, KEY, "zset")
    assert key.claim("w1#1", 2) == [b"http://a.example/4", b"http://a.example/3"]
    assert key.claim("w1#2", 1) == [b"http://a.example/half"]
    assert redis_client.zcard(KEY) == 3
    redis_client.zadd(KEY, {"http://a.example/3": 99})  # pushed again meanwhile
    assert key.recover(["w1#2", "w1#1"]) == 3
    pairs = cast("list[tuple[bytes, float]]", redis_client.zrange(KEY, 0, -1, withscores=True))
    back = {m.decode(): s for m, s in pairs}
    assert back == {**scores, "http://a.example/3": 99.0}  # the newer score wins


def test_claim_of_an_empty_key_claims_nothing(redis_client: redis.Redis) -> None:
    for kind in ("list", "set", "zset"):
        assert StartKey(redis_client, KEY, kind).claim("w1#1", 5) == []
    assert not redis_client.exists(start_claims(KEY))


def test_only_claims_of_stopped_workers_go_back(redis_client: redis.Redis) -> None:
    redis_client.rpush(KEY, *(f"http://a.example/{i}" for i in range(8)))
    key = StartKey(redis_client, KEY, "list")
    for field in ("me#1", "live#1", "dead#1", "dead#2", "gone:host:1#1"):
        key.claim(field, 1)
    now = time.time()
    workers = {"me": now + 10, "live": now + 10, "dead": now - 0.5}
    back, live = key.recover_stopped("me", workers, now)
    assert (back, live) == (3, ["live"])  # dead (2 claims) and gone (no heartbeat at all)
    assert sorted(key.owners()) == ["live", "me"]
    assert redis_client.llen(KEY) == 3 + 3


def test_settle_clears_the_claim_and_keeps_refused_entries_capped(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(spiders, "REFUSED_MAX", 3)
    redis_client.rpush(KEY, "a", "b")
    key = StartKey(redis_client, KEY, "list")
    key.claim("w1#1", 2)
    key.settle("w1#1", [json.dumps({"entry": f"bad{i}"}) for i in range(5)])
    assert not redis_client.exists(start_claims(KEY))
    kept = [json.loads(r)["entry"] for r in redis_client.lrange(start_refused(KEY), 0, -1)]
    assert kept == ["bad4", "bad3", "bad2"]  # newest first, the last 3


@pytest.mark.parametrize("kind", ["list", "set", "zset"])
def test_claims_work_on_a_redis_cluster(redis_cluster: LocalCluster, kind: str) -> None:
    """The claim, settle and recover scripts touch the start key and the keys beside it
    in one slot: no CROSSSLOT on a cluster, for a key without a hash tag."""
    client = cluster.client(redis_cluster)
    name = f"claims-{kind}:start_urls"
    try:
        if kind == "zset":
            client.zadd(name, {"http://a.example/1": 1, "http://a.example/2": 2})
        elif kind == "set":
            client.sadd(name, "http://a.example/1", "http://a.example/2")
        else:
            client.rpush(name, "http://a.example/1", "http://a.example/2")
        key = StartKey(client, name, kind)
        assert len(key.claim("w1#1", 1)) == 1
        assert key.recover_stopped(None, {}, time.time()) == (1, [])
        assert len(key.claim("w1#2", 2)) == 2
        key.settle("w1#2", [json.dumps({"entry": "x", "reason": "test"})])
        assert not client.exists(start_claims(name)) and not client.exists(name)
        assert client.llen(start_refused(name)) == 1
    finally:
        client.delete(name, start_claims(name), start_refused(name))
        client.close()


def test_an_acl_user_limited_to_the_prefix_can_claim(
    redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    """The keys beside a start key start with its name: a user whose pattern covers the
    start key (``~rc:*`` for ``rc:shop:start_urls``) may claim; outside, the error names
    the pattern that covers both."""
    redis7_client.execute_command(
        "ACL", "SETUSER", "rcclaim", "on", ">pw", "~rc:*", "+@all", "-@dangerous"
    )
    user = redis.Redis.from_url(redis7.url, username="rcclaim", password="pw")
    try:
        redis7_client.rpush("rc:shop:start_urls", "http://a.example/")
        key = StartKey(user, "rc:shop:start_urls", "list")
        assert key.claim("w1#1", 5) == [b"http://a.example/"]
        assert key.recover(["w1#1"]) == 1
        with pytest.raises(ConfigError) as info:
            StartKey(user, KEY, "list").claim("w1#1", 5)
        assert f"~{KEY}*" in str(info.value)
    finally:
        user.close()
        redis7_client.execute_command("ACL", "DELUSER", "rcclaim")


def test_the_feeder_tells_without_waiting_when_a_generation_is_stored(
    redis7_client: redis.Redis,
) -> None:
    """What a claim is cleared by: ``Feeder.stored_through(generation)`` is False while
    the requests buffered up to then are not in Redis, True once they are."""
    front = open_frontier(redis7_client, Settings(), "claim-gen")
    feeder = Feeder(front, "w1", tick=60.0, heartbeat=60.0)
    url = "http://a.example/1"
    feeder.store(Envelope(url=url, fingerprint=fingerprint(url)))
    generation = feeder.generation()
    assert generation > 0 and not feeder.stored_through(generation)  # thread not started
    feeder.start()
    try:
        assert feeder.flush(wait=10.0)
        assert feeder.stored_through(generation)
        assert front.counts().accepted == 1
    finally:
        feeder.stop(timeout=10.0)


# --- refused entries --------------------------------------------------------------------
class Shop(RedisSpider):
    name = "shop"


def test_refused_entries_land_in_the_refused_list_without_a_scheduler(
    redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    try:
        crawler = get_crawler(Shop, {"REDCRAWL_REDIS_URL": redis7.url})
    except RuntimeError:  # Scrapy 2.13's get_crawler wants an installed reactor
        from scrapy.utils.reactor import install_reactor

        install_reactor("twisted.internet.asyncioreactor.AsyncioSelectorReactor")
        crawler = get_crawler(Shop, {"REDCRAWL_REDIS_URL": redis7.url})
    spider = Shop.from_crawler(crawler)
    redis7_client.rpush(KEY, "http://a.example/ok", "{not json", "file:///etc/passwd")
    assert [r.url for r in spider.next_requests()] == ["http://a.example/ok"]
    records = [json.loads(r) for r in redis7_client.lrange(start_refused(KEY), 0, -1)]
    assert [r["entry"] for r in records] == ["file:///etc/passwd", "{not json"]
    assert all(r["reason"] for r in records)
    assert crawler.stats.get_value("redcrawl/start_entries/refused") == 2


@pytest.fixture
def site() -> Iterator[ShopSite]:
    with ShopSite(SiteConfig(products=6, per_page=3, categories=2, tracking_params=False)) as s:
        yield s


def test_a_crawl_keeps_refused_entries_and_clears_its_claims(
    tmp_path: Path, redis7: RedisServer, redis7_client: redis.Redis, site: ShopSite
) -> None:
    key = "start_entries:start_urls"
    bad = [
        "{not json",
        "ftp://127.0.0.1:1/x",
        json.dumps({"url": site.url + "/", "callback": "_x"}),
    ]
    redis7_client.rpush(key, site.url + "/product/1", *bad, site.url + "/product/2")
    run = run_spider(
        "start_entries_spider.py",
        tmp_path,
        redis_url=redis7.url,
        crawl="start-claim-refused",
        settings={"REDIS_START_URLS_BATCH_SIZE": "2"},
    )
    run.ok()
    assert site.hits() == {"/product/1": 1, "/product/2": 1}
    records = [json.loads(r) for r in redis7_client.lrange(start_refused(key), 0, -1)]
    assert [r["entry"] for r in records] == bad[::-1]  # newest first
    assert all(r["reason"] and r["worker"] for r in records), records
    assert run.stats["redcrawl/start_entries/refused"] == 3
    assert start_refused(key) in run.stderr  # the log says where they are
    assert not redis7_client.exists(start_claims(key))  # every claim cleared


# --- a lost reply --------------------------------------------------------------------------
def _entries_on_the_key(client: redis.Redis, kind: str) -> list[str]:
    raw: Any = {
        "list": lambda: client.lrange(KEY, 0, -1),
        "set": lambda: list(client.smembers(KEY)),
        "zset": lambda: client.zrange(KEY, 0, -1),
    }[kind]()
    return sorted(e.decode() for e in raw)


@pytest.mark.parametrize("kind", ["list", "set", "zset"])
def test_a_claim_whose_reply_is_lost_is_answered_with_the_same_batch(
    redis_client: redis.Redis, dropper: ReplyDropper, kind: str
) -> None:
    """The claim ran, its reply was lost, and redis-py sent it again with the same field
    (a worker's client retries): the retry must get the batch the first run took. Before,
    it took a second batch and its HSET overwrote the first one's claim: the first batch
    was off the key and in no claim, lost."""
    entries = [f"http://a.example/{i}" for i in range(6)]
    if kind == "list":
        redis_client.rpush(KEY, *entries)
    elif kind == "set":
        redis_client.sadd(KEY, *entries)
    else:
        redis_client.zadd(KEY, {e: i for i, e in enumerate(entries)})
    direct = StartKey(redis_client, KEY, kind)
    proxied = StartKey(dropper.client(Settings()), KEY, kind)
    redis_client.script_load(direct._scripts["claim"].script)  # the dropped reply is its own

    dropper.arm()
    got = proxied.claim("w1#1", 2)

    assert dropper.dropped == 1  # the first run's reply really was lost
    assert len(got) == 2
    assert len(_entries_on_the_key(redis_client, kind)) == 4, "the retry took a second batch"
    assert direct.recover(["w1#1"]) == 2
    assert _entries_on_the_key(redis_client, kind) == sorted(entries)  # nothing lost
