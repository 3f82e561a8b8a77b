"""What only the streams backend has: shards, consumer groups, pending entries, trimming.

The shared state-machine tests (test_frontier.py, test_frontier_properties.py,
test_kill.py) run on this backend too."""

from __future__ import annotations

import hashlib
from collections import Counter
from typing import Any, cast

import pytest
import redis

from redcrawl.codec import Envelope
from redcrawl.errors import ConfigError, FrontierError
from redcrawl.frontier import FrontierCore, ListsFrontier, StreamsFrontier, open_frontier
from redcrawl.frontier.streams import GROUP, host_of, shard_of
from redcrawl.settings import Settings

from .conftest import Clock, FrontierFactory

pytestmark = pytest.mark.backends("streams")


@pytest.fixture
def make_frontier(make_frontier: FrontierFactory) -> FrontierFactory:
    """Streams crawls without politeness unless a test asks: these tests are about what
    the streams hold (with politeness ready requests wait in per-key queues and a stream
    holds only granted entries: tests/test_politeness_frontier.py, test_streams_polite)."""

    def make(crawl: str = "c", **settings: Any) -> FrontierCore:
        return make_frontier(crawl, **{"politeness": False, **settings})

    return make


def env(url: str, priority: int = 0) -> Envelope:
    return Envelope(url=url, priority=priority, fingerprint=hashlib.sha1(url.encode()).digest())


def streams_of(f: FrontierCore) -> StreamsFrontier:
    assert isinstance(f, StreamsFrontier)
    return f


def pending_rows(client: redis.Redis, f: StreamsFrontier) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for key in f.stream_keys():
        if client.exists(key) and client.xinfo_groups(key):
            rows += [{**r, "key": key} for r in client.xpending_range(key, GROUP, "-", "+", 1000)]
    return rows


def consumers(client: redis.Redis, f: StreamsFrontier) -> set[str]:
    names: set[str] = set()
    for key in f.stream_keys():
        if client.exists(key) and client.xinfo_groups(key):
            names |= {c["name"].decode() for c in client.xinfo_consumers(key, GROUP)}
    return names


def test_open_frontier_picks_the_backend_and_streams_need_fifo(
    redis_client: redis.Redis, frontier_backend: str
) -> None:
    f = open_frontier(redis_client, Settings(backend="streams"), "c")
    assert isinstance(f, StreamsFrontier) and f.BACKEND == "streams"
    assert type(open_frontier(redis_client, Settings(), "c")) is ListsFrontier
    with pytest.raises(ConfigError, match="REDCRAWL_ORDERING"):
        Settings(backend="streams", ordering="priority")
    with pytest.raises(ConfigError, match="REDCRAWL_SHARDS"):
        Settings(shards=0)
    assert Settings.from_env({"REDCRAWL_BACKEND": "streams", "REDCRAWL_SHARDS": "3"}).shards == 3


def test_burst_larger_than_any_maxlen_loses_nothing(
    make_frontier: FrontierFactory, redis_client: redis.Redis
) -> None:
    """50,000 pushes before any consumer exists: nothing is trimmed; every request is
    consumed and acked exactly once; afterwards the streams are empty."""
    n = 50_000
    f = streams_of(make_frontier(batch_size=1000))
    envs = [env(f"http://h{i % 97}.example/{i}", priority=(i % 3) - 1) for i in range(n)]
    assert f.push(envs).accepted == n
    lengths = [redis_client.xlen(k) for k in f.stream_keys()]
    assert sum(lengths) == n and min(lengths) > 0  # every stream got some
    c = f.counts()
    assert (c.accepted, c.ready, c.in_flight) == (n, n, 0)
    seen: Counter[bytes] = Counter()
    acked = 0
    workers = ["w1", "w2", "w3"]
    turn = 0
    while True:
        leases = f.lease(workers[turn % 3], 1000)
        turn += 1
        if not leases:
            break
        seen.update(x.id for x in leases)
        acked += f.ack(leases)
    assert acked == n and len(seen) == n and set(seen.values()) == {1}
    c = f.counts()
    assert (c.done, c.ready, c.in_flight, c.dead) == (n, 0, 0, 0) and c.conserved
    assert [redis_client.xlen(k) for k in f.stream_keys()] == [0] * len(f.stream_keys())
    assert redis_client.hlen(f.keys.req) == 0


def test_group_is_created_from_the_start_of_a_backlog(
    make_frontier: FrontierFactory, redis_client: redis.Redis
) -> None:
    f = streams_of(make_frontier(shards=2))
    f.push([env(f"http://a/{i}") for i in range(5)])
    key = f.keys.stream(shard_of("http://a/", 2), False)
    assert redis_client.xlen(key) == 5
    assert redis_client.xinfo_groups(key) == []  # a backlog without a group
    assert f.counts().ready == 5
    got = f.lease("w", 10)
    assert [x.envelope.url for x in got] == [f"http://a/{i}" for i in range(5)]
    (group,) = redis_client.xinfo_groups(key)
    assert group["name"] == GROUP.encode() and group["pending"] == 5


def test_high_streams_are_read_first_fifo_within_a_stream(
    make_frontier: FrontierFactory, redis_client: redis.Redis
) -> None:
    f = streams_of(make_frontier())
    f.push(
        [
            env("http://a/lo1", -1),
            env("http://a/mid", 0),
            env("http://a/hi1", 1),
            env("http://b/hi", 5),
            env("http://a/hi2", 3),
            env("http://a/lo2", -7),
        ]
    )
    got = [x.envelope.url for x in f.lease("w", 6)]
    assert set(got[:3]) == {"http://a/hi1", "http://a/hi2", "http://b/hi"}
    assert got.index("http://a/hi1") < got.index("http://a/hi2")
    assert [u for u in got[3:] if u.startswith("http://a/")] == [
        "http://a/lo1",
        "http://a/mid",
        "http://a/lo2",
    ]
    high = f.keys.stream(shard_of("http://a/", 8), True)
    low = f.keys.stream(shard_of("http://a/", 8), False)
    assert redis_client.xlen(high) == 2 and redis_client.xlen(low) == 3


def test_same_host_same_shard_and_lua_agrees_with_python(
    make_frontier: FrontierFactory, redis_client: redis.Redis, clock: Clock
) -> None:
    f = streams_of(make_frontier(shards=16))
    assert host_of("HTTPS://User:pw@Example.COM:8443/x?y#z") == b"example.com"
    assert host_of("http://[::1]:80/") == b"[::1]"
    assert host_of("mailto:x@y") == b"y"
    assert len({shard_of(f"http://example.com/{i}", 16) for i in range(100)}) == 1
    assert len({shard_of(f"http://site{i}.com/", 16) for i in range(200)}) == 16
    tricky = [
        "HTTPS://User:pw@Example.COM:8443/x?y#z",
        "http://[::1]:80/a",
        "http://ÄÖ.de/ü",
        "http://a.b.c/?q=@x",
        "ftp://h",
        "http://h#frag@x",
        "weird",
        "http://x:y@/p",
    ]
    f.push([env(u) for u in tricky])
    where = {r["key"]: r for r in pending_rows(redis_client, f)}
    assert not where
    for lease in f.lease("w", 100):
        key = f.keys.stream(shard_of(lease.envelope.url, 16), False)
        assert lease.token.split("/")[1] == str(f.stream_keys().index(key))
        # back through DELAYED: Lua recomputes the shard from the stored URL
        assert f.nack(lease, "again", delay=1) == "retried"
    clock.advance(2)
    f.maintain()
    for key in f.stream_keys():
        entries = cast("list[tuple[bytes, dict[bytes, bytes]]]", redis_client.xrange(key))
        for _eid, fields in entries:
            url = f.describe(fields[b"r"].hex())
            assert url is not None and url.envelope is not None
            assert key == f.keys.stream(shard_of(url.envelope.url, 16), False), url


def test_expired_entries_are_claimed_but_a_live_workers_are_not(
    make_frontier: FrontierFactory, redis_client: redis.Redis, clock: Clock
) -> None:
    f = streams_of(make_frontier(lease_ttl=10))
    f.push([env(f"http://a/{i}") for i in range(4)])
    live = f.lease("live", 2)
    gone = f.lease("gone", 2)
    clock.advance(6)
    f.renew("live")
    clock.advance(6)  # both leases are 12 s old; only "live" heartbeated
    got = f.lease("w3", 10)
    assert {x.id for x in got} == {x.id for x in gone}
    assert all(x.attempts == 2 for x in got)
    rows = {r["message_id"]: r for r in pending_rows(redis_client, f)}
    owners = Counter(r["consumer"].decode() for r in rows.values())
    assert owners == {"live": 2, "w3": 2}
    # delivery count == attempts
    assert sorted(r["times_delivered"] for r in rows.values()) == [1, 1, 2, 2]
    assert f.ack(gone) == 0 and f.ack(live) == 2 and f.ack(got) == 2
    assert f.counts().finished


def test_dead_consumers_leave_the_group_after_their_entries_are_claimed(
    make_frontier: FrontierFactory, redis_client: redis.Redis, clock: Clock
) -> None:
    f = streams_of(make_frontier(lease_ttl=5, shards=2))
    f.push([env(f"http://h{i}/") for i in range(6)])
    f.lease("dead", 6)
    assert "dead" in consumers(redis_client, f)
    clock.advance(6)
    got = f.lease("heir", 6)
    assert len(got) == 6
    assert consumers(redis_client, f) == {"heir"}
    f.ack(got)
    # a consumer that acked all it read, and then died, goes at maintain
    f.push([env("http://last/")])
    f.ack(f.lease("idle", 1))
    assert "idle" in consumers(redis_client, f)
    f.maintain()
    assert "idle" in consumers(redis_client, f)  # still alive
    clock.advance(6)
    f.maintain()
    assert "idle" not in consumers(redis_client, f)


def test_release_worker_and_forget_worker_remove_the_consumer(
    make_frontier: FrontierFactory, redis_client: redis.Redis
) -> None:
    f = streams_of(make_frontier(shards=2))
    f.push([env(f"http://h{i}/") for i in range(6)])
    f.lease("w1", 4)
    assert f.release_worker("w1") == 4
    c = f.counts()
    assert (c.ready, c.in_flight, c.reclaimed) == (6, 0, 4) and c.conserved
    assert "w1" not in consumers(redis_client, f)
    held = f.lease("w2", 6)
    assert f.release(held) == 6
    f.forget_worker("w2")
    assert "w2" not in consumers(redis_client, f) and "w2" not in f.workers()


def test_delivery_count_to_dead_with_the_last_error(
    make_frontier: FrontierFactory, redis_client: redis.Redis
) -> None:
    f = streams_of(make_frontier(max_attempts=3))
    f.push([env("http://a/poison")])
    errors = ["HTTP 500", "HTTP 502", "HTTP 503 final"]
    for i, err in enumerate(errors, 1):
        (lease,) = f.lease("w", 1)
        (row,) = pending_rows(redis_client, f)
        assert lease.attempts == i == row["times_delivered"]
        assert f.nack(lease, err, delay=0) == ("dead" if i == 3 else "retried")
    (dead,) = f.dead()
    assert (dead.error, dead.attempts) == ("HTTP 503 final", 3)
    assert pending_rows(redis_client, f) == []
    assert sum(redis_client.xlen(k) for k in f.stream_keys()) == 0  # nothing left behind
    assert f.requeue_dead() == 1
    (lease,) = f.lease("w", 1)
    assert lease.attempts == 1 and pending_rows(redis_client, f)[0]["times_delivered"] == 1


def test_pause_stops_leasing_but_expired_leases_still_come_back(
    make_frontier: FrontierFactory, clock: Clock
) -> None:
    f = streams_of(make_frontier(lease_ttl=5))
    f.push([env(f"http://a/{i}") for i in range(3)])
    f.lease("gone", 2)
    f.pause()
    clock.advance(6)
    assert f.lease("w", 3) == []
    c = f.counts()
    assert (c.ready, c.in_flight, c.reclaimed) == (3, 0, 2) and c.conserved
    f.resume()
    assert len(f.lease("w", 3)) == 3


def test_shards_inspection(make_frontier: FrontierFactory, clock: Clock) -> None:
    f = streams_of(make_frontier(shards=4))
    f.push([env("http://a/1", 5), env("http://a/2"), env("http://b/1")])
    (lease,) = f.lease("worker-7", 1)
    clock.advance(3)
    rows = f.shards()
    assert sum(r.length for r in rows) == 3 and sum(r.pending for r in rows) == 1
    (held,) = [r for r in rows if r.pending]
    assert (held.shard, held.stream) == (shard_of("http://a/", 4), "high")
    (entry,) = held.entries
    assert (entry.id, entry.consumer, entry.deliveries) == (lease.id.hex(), "worker-7", 1)
    assert entry.idle == pytest.approx(3, abs=0.01)
    assert held.ready == 0 and held.consumers == 1
    info = f.describe(lease.id.hex())
    assert info is not None and (info.state, info.worker) == ("in_flight", "worker-7")


def test_layouts_are_fixed_per_crawl(
    make_frontier: FrontierFactory, redis_client: redis.Redis
) -> None:
    f = make_frontier(shards=4)
    f.push([env("http://a/1")])
    with pytest.raises(FrontierError, match="REDCRAWL_SHARDS"):
        make_frontier(shards=8).lease("w", 1)
    lists = open_frontier(redis_client, Settings(), "c")
    with pytest.raises(FrontierError, match="REDCRAWL_BACKEND"):
        lists.lease("w", 1)
    f.purge()
    assert redis_client.keys("rc:{c}:s:*") == []
    assert lists.push([env("http://a/1")]).accepted == 1  # a purged crawl takes a new layout
