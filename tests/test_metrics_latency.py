"""The enqueue -> DONE latency histogram the ack step keeps in Redis (lua/latency.lua):
every push stamps its records with the server's time, every ack adds NOW - stamp."""

from __future__ import annotations

import hashlib

import pytest
import redis

from redcrawl.codec import Envelope
from redcrawl.frontier.records import parse_record, push_time

from .conftest import Clock, FrontierFactory


def env(url: str) -> Envelope:
    return Envelope(url=url, fingerprint=hashlib.sha1(url.encode()).digest())


def lat(stats: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in stats.items() if k.startswith("lat")}


@pytest.mark.parametrize("politeness", [False, True])
def test_ack_adds_each_request_latency_since_its_push(
    make_frontier: FrontierFactory, clock: Clock, redis_client: redis.Redis, politeness: bool
) -> None:
    f = make_frontier(politeness=politeness, politeness_delay=0.0, politeness_concurrency=100)
    f.push([env(f"http://h{i}.example/") for i in range(3)])
    pushed = clock.ms
    stored: list[bytes] = redis_client.hvals(f.keys.req)  # type: ignore[assignment]
    assert [push_time(r) for r in stored] == [pushed / 1000] * 3
    clock.advance(2)
    leased = f.lease("w", 3)
    assert sorted(x.envelope.url for x in leased) == [f"http://h{i}.example/" for i in range(3)]
    f.ack(leased[:1])
    assert lat(f.stats()) == {"lat:5000": 1, "lat_sum": 2000}
    clock.advance(100)
    f.ack(leased[1:])
    assert lat(f.stats()) == {"lat:5000": 1, "lat:300000": 2, "lat_sum": 2000 + 2 * 102000}


def test_latency_counts_from_the_first_push_through_retries(
    make_frontier: FrontierFactory, clock: Clock
) -> None:
    f = make_frontier(max_attempts=3)
    f.push([env("http://a.example/")])
    clock.advance(1)
    (lease,) = f.lease("w", 1)
    f.nack(lease, "boom", delay=0)
    clock.advance(30)
    f.maintain()
    (again,) = f.lease("w", 1)
    assert again.attempts == lease.attempts + 1
    f.ack([again])
    assert lat(f.stats()) == {"lat:60000": 1, "lat_sum": 31000}


def test_records_without_a_push_stamp_are_read_and_not_counted(
    make_frontier: FrontierFactory, redis_client: redis.Redis
) -> None:
    f = make_frontier(politeness=False)
    f.push([env("http://a.example/")])
    (rid,) = redis_client.hkeys(f.keys.req)
    rec: bytes | None = redis_client.hget(f.keys.req, rid)  # type: ignore[assignment]
    assert rec is not None and push_time(rec) is not None
    old = rec[:-8]  # as stored before push stamps existed
    assert push_time(old) is None
    assert parse_record(old)[3] == parse_record(rec)[3]
    redis_client.hset(f.keys.req, rid, old)
    (lease,) = f.lease("w", 1)
    assert lease.envelope.url == "http://a.example/"
    f.ack([lease])
    assert lat(f.stats()) == {}
    assert f.counts().done == 1


def test_only_crawls_created_with_push_stamps_get_them(
    make_frontier: FrontierFactory, redis_client: redis.Redis
) -> None:
    """An older worker reads a stamped record as an undecodable request (trailing bytes
    after its envelope): a new crawl's layout carries a mark that such a worker does not
    compute, so it is refused by the layout check, and a crawl created before stamps keeps
    its layout and gets no stamps, so older and newer workers can share it."""
    new = make_frontier("new")
    new.push([env("http://a.example/")])
    layout = redis_client.hget(new.keys.control, "layout")
    assert isinstance(layout, bytes) and layout.endswith(b" +pushtime")
    stored: list[bytes] = redis_client.hvals(new.keys.req)  # type: ignore[assignment]
    assert push_time(stored[0]) is not None

    # the same crawl as the code before stamps created it: its layout without the mark
    old = make_frontier("old")
    before = layout.removesuffix(b" +pushtime")
    redis_client.hset(old.keys.control, mapping={"layout": before, "layout.copy": before})
    old.push([env("http://b.example/")])
    stored = redis_client.hvals(old.keys.req)  # type: ignore[assignment]
    assert push_time(stored[0]) is None  # what an older worker can decode
    assert redis_client.hget(old.keys.control, "layout") == before  # kept
    (lease,) = old.lease("w", 1)
    old.ack([lease])
    assert old.counts().done == 1 and lat(old.stats()) == {}
