"""Push stamps written by the worker (``FrontierCore._push_stamp``, settle.lua's ARGV[16]):
a settle call's records carry their stamp already once the worker knows the server's
clock, so that the script does not build a new string per record; what is stored is the
same as when the script stamps them (lua/latency.lua)."""

from __future__ import annotations

import hashlib

import redis

from redcrawl.codec import Envelope
from redcrawl.frontier.core import push_stamp
from redcrawl.frontier.records import push_time

from .conftest import Clock, FrontierFactory


def env(url: str) -> Envelope:
    return Envelope(url=url, fingerprint=hashlib.sha1(url.encode()).digest())


def stored(r: redis.Redis, key: str, url: str) -> bytes:
    raw = r.hget(key, hashlib.sha1(url.encode()).digest())
    assert isinstance(raw, bytes)
    return raw


def server_ms(r: redis.Redis) -> int:
    sec, usec = r.time()
    return int(sec) * 1000 + int(usec) // 1000


def test_the_encoding_reads_back() -> None:
    for ms in (0, 1, 63, 64, 1_764_000_000_123, 2**42 - 1):
        stamp = push_stamp(ms)
        assert len(stamp) == 8 and stamp[0] == 127
        assert push_time(b"0|0||\x80" + stamp) == ms / 1000


def test_a_worker_stamped_record_is_the_one_the_script_would_store(
    make_frontier: FrontierFactory, redis_client: redis.Redis, clock: Clock
) -> None:
    f = make_frontier()
    (call,) = f._settle_calls([env("http://a/1")], (), None, None)
    assert call[11] == "1"  # (the test clock is the scripts' clock: known at once)
    f.settle(push=[env("http://a/1")])
    # push.lua (recrawl) still stamps in the script
    f.push([env("http://a/2")], recrawl=True)
    one, two = (
        stored(redis_client, f.keys.req, "http://a/1"),
        stored(redis_client, f.keys.req, "http://a/2"),
    )
    assert push_time(one) == push_time(two) == clock.ms / 1000
    assert one[-8:] == two[-8:] == push_stamp(clock.ms)
    assert one[:-8] == f._record(env("http://a/1"))
    (lease,) = f.lease("w", 1)
    clock.advance(0.2)
    assert f.ack([lease]) == 1
    stats = f.stats()
    assert stats.get("lat:500") == 1 and stats.get("lat_sum") == 200, stats


def test_on_the_server_clock_the_first_call_is_stamped_by_the_script(
    make_frontier: FrontierFactory, redis_client: redis.Redis
) -> None:
    f = make_frontier(use_clock=False)
    (first,) = f._settle_calls([env("http://a/1")], (), None, None)
    assert first[11] == ""  # no reply seen yet: the server's clock is unknown
    before = server_ms(redis_client)
    f.settle(push=[env("http://a/1")])
    (later,) = f._settle_calls([env("http://a/2")], (), None, None)
    assert later[11] == "1"  # the reply's server time bounds the clocks' offset
    f.settle(push=[env("http://a/2"), env("http://a/3")])
    after = server_ms(redis_client)
    for url in ("http://a/1", "http://a/2", "http://a/3"):
        at = push_time(stored(redis_client, f.keys.req, url))
        assert at is not None
        # (the worker's reading is never before the server's time when it was taken,
        # and later by at most a call's send-to-run time)
        assert before - 1 <= at * 1000 <= after + 5000, (url, before, at, after)
    assert f.counts().conserved
