"""Corrupt state never stalls a crawl (issue 11, items 9-12): garbage written straight into
a crawl's keys with a raw Redis client, on both backends and both Redis versions.

The rule: a corrupt record goes to DEAD with a reason; a corrupt entry of a crawl-wide
structure is repaired when its right value is known (counters, heartbeats, lease
records); a script validates what it reads before its first write, so it never fails
halfway through a change; readers raise redcrawl errors, never raw Redis or Lua ones; and
one broken crawl does not break another.
"""

from __future__ import annotations

import dataclasses
import hashlib

import pytest
import redis

from redcrawl.codec import Envelope
from redcrawl.errors import RedcrawlError
from redcrawl.frontier import FrontierCore, StreamsFrontier, open_frontier
from redcrawl.settings import Settings

from .conftest import Clock, FrontierFactory


def urls(n: int, prefix: str = "http://example.com/p") -> list[Envelope]:
    return [
        Envelope(url=f"{prefix}{i}", fingerprint=hashlib.sha1(f"{prefix}{i}".encode()).digest())
        for i in range(n)
    ]


def drain(f: FrontierCore, clock: Clock) -> None:
    """Lease and ack until the crawl is finished (expiring leases on the way)."""
    for _ in range(50):
        got = f.lease("drain", 100)
        if got:
            f.ack(got)
            continue
        if f.counts().finished:
            return
        clock.advance(100)
    raise AssertionError(f"the crawl never finished: {f.counts()}")


def test_a_header_number_lua_cannot_hold_goes_dead_not_in_flight_forever(
    make_frontier: FrontierFactory, redis_client: redis.Redis, clock: Clock
) -> None:
    """Item 9: attempts beyond 2^53 became "1e+20" in Lua, which no parser reads back."""
    f = make_frontier()
    envs = urls(3)
    f.push(envs)
    fp = envs[0].fingerprint
    assert fp is not None
    rec = redis_client.hget(f.keys.req, fp)
    assert isinstance(rec, bytes)
    _p, _a, _t, body = rec.split(b"|", 3)
    redis_client.hset(f.keys.req, fp, b"0|99999999999999999999||" + body)
    got = f.lease("w", 3)
    assert len(got) == 2
    f.ack(got)
    drain(f, clock)
    c = f.counts()
    assert c.conserved and c.finished and (c.done, c.dead) == (2, 1), c
    [dead] = f.dead()
    assert "state header" in dead.error


def test_a_held_record_corrupted_in_flight_goes_dead_when_its_lease_expires(
    make_frontier: FrontierFactory, redis_client: redis.Redis, clock: Clock
) -> None:
    f = make_frontier()
    envs = urls(2)
    f.push(envs)
    got = f.lease("w", 2)
    rid = got[0].id
    redis_client.hset(f.keys.req, rid, b"\xff garbage")
    assert f.ack(got) == 1  # the corrupt one is not acked (its token cannot be read)
    clock.advance(60)
    drain(f, clock)
    c = f.counts()
    assert c.conserved and c.finished and (c.done, c.dead) == (1, 1), c


@pytest.mark.parametrize("give_back", ["ack", "nack", "release"])
def test_a_record_corrupted_in_a_live_workers_hands_goes_dead_when_given_back(
    make_frontier: FrontierFactory, redis_client: redis.Redis, give_back: str
) -> None:
    """A live worker renews its leases forever: the corrupt record must not wait for an
    expiry that never comes."""
    f = make_frontier()
    f.push(urls(2))
    got = f.lease("w", 2)
    redis_client.hset(f.keys.req, got[0].id, b"\x00")
    if give_back == "ack":
        assert f.ack(got) == 1
    elif give_back == "nack":
        assert f.nack(got[0], "boom") == "dead"
        f.ack(got[1:])
    else:
        f.release(got)
        f.ack(f.lease("w", 2))
    c = f.counts()
    assert c.conserved and c.finished and (c.done, c.dead) == (1, 1), c
    assert "state header" in f.dead()[0].error


@pytest.mark.backends("lists")
def test_a_garbage_lease_record_breaks_neither_leasing_nor_inspection(
    make_frontier: FrontierFactory, redis_client: redis.Redis, clock: Clock
) -> None:
    """Item 10: one garbage entry in the leases hash made every lease of the crawl fail."""
    f = make_frontier()
    f.push(urls(6))
    held = f.lease("w1", 3)
    token = held[0].token
    redis_client.hset(f.keys.leases, token, b"\xc1\xff not msgpack")
    assert f.inflight() == [] or all(i.worker in ("w1", "?") for i in f.inflight())
    info = f.describe(held[0].id.hex())
    assert info is not None and info.state == "in_flight"
    assert f.release_worker("nobody") == 0
    clock.advance(60)  # the lease expires: its requests come back though its record is gone
    assert len(f.lease("w2", 10)) == 6
    c = f.counts()
    assert c.conserved and c.in_flight == 6 and c.reclaimed == 3, c


@pytest.mark.backends("lists")
@pytest.mark.parametrize("politeness", [False, True])
def test_a_garbage_lease_record_finds_a_request_an_older_lease_still_lists(
    make_frontier: FrontierFactory, redis_client: redis.Redis, clock: Clock, politeness: bool
) -> None:
    """A lease's entry keeps listing a request released from it while the lease holds
    another: that request, leased again under a lease whose entry is then corrupted, must
    still come back when that lease expires (the scan took it for the older lease's and it
    was lost: found by review). Records without lease state (new lists crawls)."""
    f = make_frontier(politeness=politeness)
    f.push(urls(2))
    x, y = f.lease("w1", 2)
    f.release([x])
    (again,) = f.lease("w2", 1, ttl=5)
    assert again.id == x.id
    redis_client.hset(f.keys.leases, again.token, b"\xc1\xff not msgpack")
    clock.advance(6)  # w2's lease expires; w1's (ttl 10 s from its start) does not yet
    f.maintain()
    assert f.ack([y]) == 1
    (back,) = f.lease("w3", 1)
    assert back.id == x.id and f.ack([back]) == 1
    c = f.counts()
    assert c.conserved and c.finished and (c.done, c.dead) == (2, 0), c


@pytest.mark.backends("lists")
def test_a_garbage_left_count_or_heartbeat_is_repaired(
    make_frontier: FrontierFactory, redis_client: redis.Redis, clock: Clock
) -> None:
    f = make_frontier()
    f.push(urls(6))
    held = f.lease("w1", 3)
    redis_client.hset(f.keys.left, held[0].token, b"zz")
    redis_client.hset(f.keys.workers, "w1", b"\x00\x01")
    assert f.ack(held[:1]) == 1
    assert len(f.lease("w2", 1)) == 1
    clock.advance(60)
    drain(f, clock)
    c = f.counts()
    assert c.conserved and c.finished and c.done == 6, c


@pytest.mark.parametrize("counter", ["leases", "seq", "inflight", "died", "accepted", "done"])
def test_a_garbage_counter_is_repaired_before_any_write(
    make_frontier: FrontierFactory, redis_client: redis.Redis, clock: Clock, counter: str
) -> None:
    """Item 11: with stats.leases = 'abc' the lease script popped 3 ids and then failed
    (a script is not rolled back): 3 requests lost."""
    f = make_frontier()
    envs = urls(5)
    f.push(envs)
    f.push([Envelope(url="http://example.com/again", dont_filter=True)])
    redis_client.hset(f.keys.stats, counter, b"abc")
    got = f.lease("w", 3)
    assert len(got) == 3
    assert f.ack(got) == 3
    f.push([Envelope(url="http://example.com/again", dont_filter=True)])
    drain(f, clock)
    c = f.counts()
    assert c.conserved and c.finished and c.done == 7, c


def test_counts_repairs_a_garbage_counter_and_other_crawls_are_unaffected(
    make_frontier: FrontierFactory, redis_client: redis.Redis
) -> None:
    """Item 12 (frontier side): stats.accepted = 'abc' made counts() raise ValueError."""
    f = make_frontier("broken")
    g = make_frontier("fine")
    f.push(urls(4))
    g.push(urls(2))
    f.ack(f.lease("w", 1))
    redis_client.hset(f.keys.stats, "accepted", b"abc")
    redis_client.hset(f.keys.stats, "retried", b"\xff")
    c = f.counts()
    assert c.conserved and (c.accepted, c.done, c.ready) == (4, 1, 3), c
    assert g.counts().accepted == 2
    redis_client.hset(f.keys.stats, "items", b"x")  # a counter of add_stats
    assert "items" not in f.stats()
    assert f.stats()["accepted"] == 4


def test_a_garbage_layout_is_a_clear_error_or_restored(
    make_frontier: FrontierFactory, redis_client: redis.Redis, frontier_backend: str, clock: Clock
) -> None:
    """Item 12: a bad layout value made every crawl's listing answer 422 (a ConfigError
    about settings that were fine)."""
    f = make_frontier("broken")
    f.push(urls(3))
    redis_client.hset(f.keys.control, "layout", b"streams/0 \xff")
    # a reader following the stored layout gets the crawl as it was created
    reader = open_frontier(redis_client, Settings(), "broken", follow_layout=True)
    assert frontier_backend == reader.BACKEND
    assert reader.counts().accepted == 3
    # and a worker keeps working
    got = f.lease("w", 3)
    assert len(got) == 3 and f.ack(got) == 3
    # both copies garbage: a clear redcrawl error, not a ConfigError about the settings
    redis_client.hset(f.keys.control, mapping={"layout": b"\x00", "layout.copy": b"\x01"})
    with pytest.raises(RedcrawlError, match="layout"):
        open_frontier(redis_client, Settings(), "broken", follow_layout=True).counts()
    with pytest.raises(RedcrawlError, match="layout"):
        f.lease("w", 1)


def test_a_garbage_token_from_a_caller_is_stale_not_a_script_error(
    make_frontier: FrontierFactory, redis_client: redis.Redis
) -> None:
    f = make_frontier()
    f.push(urls(2))
    got = f.lease("w", 2)
    redis_client.hset(f.keys.req, got[0].id, b"\x00")
    bad = dataclasses.replace(got[0], token="1/0/not-an-entry-id")
    out = f.settle(push=[Envelope(url="http://example.com/child", dont_filter=True)], ack=[bad])
    assert (out.pushed.accepted, out.acked) == (1, 0)
    assert f.ack(got) == 1  # the corrupt one goes DEAD
    c = f.counts()
    assert c.conserved and (c.done, c.dead, c.ready) == (1, 1, 1), c


@pytest.mark.parametrize("key", ["dead", "req", "stats", "ready"])
def test_a_key_of_another_type_is_refused_before_anything_is_written(
    make_frontier: FrontierFactory, redis_client: redis.Redis, key: str
) -> None:
    """A whole key overwritten (here with a string) cannot be repaired, but no script may
    fail on it halfway through a change: e.g. a lease that pops ids and then fails on the
    dead set would lose them."""
    f = make_frontier()
    f.push(urls(5))
    name = (
        (f.stream_keys()[1] if isinstance(f, StreamsFrontier) else f.keys.ready(0))
        if key == "ready"
        else getattr(f.keys, key)
    )

    def content(k: str) -> object:
        # (a hash by its fields: a hash table's DUMP follows its buckets, which an
        # incremental rehash moves on any later command, reads included)
        if redis_client.type(k) == b"hash":
            return redis_client.hgetall(k)
        return redis_client.dump(k)

    other = {k: content(k) for k in f._keys if k != name and redis_client.exists(k)}
    redis_client.set(name, b"garbage")
    with pytest.raises(RedcrawlError, match="damaged.*" + name.replace("{", ".").replace("}", ".")):
        f.lease("w", 5)
    with pytest.raises(RedcrawlError, match="damaged"):
        f.push(urls(2, prefix="http://example.com/q"))
    assert {k: content(k) for k in other} == other  # nothing was written


@pytest.mark.parametrize("field", ["lat_sum", "lat:100", "lat:inf"])
def test_a_garbage_latency_field_neither_fails_an_ack_nor_stays(
    make_frontier: FrontierFactory, redis_client: redis.Redis, clock: Clock, field: str
) -> None:
    """The latency histogram's fields are written last by the ack: a garbage one made
    every ack fail after its other writes (found by the corrupting state machine)."""
    f = make_frontier()
    f.push(urls(5))
    redis_client.hset(f.keys.stats, field, b"x12")
    got = f.lease("w", 3)
    assert f.ack(got) == 3
    drain(f, clock)
    c = f.counts()
    assert c.conserved and c.finished and c.done == 5, c
    value = redis_client.hget(f.keys.stats, field)
    if field != "lat:inf":  # (written by these acks: fast ones; lat:inf is left as it is)
        assert value is not None and value.isdigit(), value


def test_a_repaired_lease_counter_hands_out_no_token_again(
    make_frontier: FrontierFactory, redis_client: redis.Redis
) -> None:
    """Lease tokens are never below the clock in microseconds (ms x 1000): a repaired
    counter set to the clock in milliseconds let the next lease in the same millisecond
    take the token of the lease before (found by the corruption state machine)."""
    f = make_frontier()
    f.push(urls(2))
    (a,) = f.lease("w1", 1)
    redis_client.hset(f.keys.stats, "leases", "")
    (b,) = f.lease("w1", 1)
    assert a.token != b.token
    assert f.ack([a]) == 1 and f.ack([b]) == 1
