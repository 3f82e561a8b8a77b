"""The response-time side of fleet-wide politeness (lists backend), against a real Redis:
a request's slot goes back when its response arrives (``free``), exactly once whatever
ends the lease after it; a 429/503 defers the request (``defer``: no attempt spent, capped,
then DEAD) and blocks its key for the fleet (Retry-After, or backoff with forgiveness);
the politeness counters (``politeness_stats``)."""

from __future__ import annotations

import json

import pytest

from redcrawl.errors import FrontierError
from redcrawl.frontier import FrontierCore, Lease
from redcrawl.frontier.core import slot_outcome
from redcrawl.frontier.records import record_holds_slot
from redcrawl.politeness import BackoffPolicy, BackoffState

from .conftest import Clock, FrontierFactory
from .test_politeness_frontier import conserved, in_flight, polite, site

pytestmark = pytest.mark.backends("lists", "streams")

OK = slot_outcome(200)


def state(f: FrontierCore, key: str) -> dict[str, str]:
    raw = f.client.hgetall(f.keys.pol_state_base + key)
    return {k.decode(): v.decode() for k, v in raw.items()}


def held_with_slot(f: FrontierCore, lease: Lease) -> bool:
    return record_holds_slot(f.client.hget(f.keys.req, lease.id))


def test_slot_outcomes() -> None:
    assert slot_outcome(200) == "s"
    assert slot_outcome(404) == "s"
    assert slot_outcome(None) == "e"
    assert slot_outcome(503, pushed_back=True) == "f"
    assert slot_outcome(429, pushed_back=True, retry_after=2.5) == "f2500"


def test_free_gives_the_slot_back_while_the_request_stays_in_flight(
    make_frontier: FrontierFactory,
) -> None:
    f = polite(make_frontier, politeness_concurrency=1)
    f.push(site("a.test", 3))
    (first,) = f.lease("w1", 10)
    assert f.lease("w2", 10) == []
    assert f.free([(first, OK)]) == 1
    assert in_flight(f, "a.test") == 0
    assert not held_with_slot(f, first)
    assert f.counts().in_flight == 1  # still leased, until its ack
    (second,) = f.lease("w2", 10)  # the slot is granted again
    assert held_with_slot(f, second)
    assert f.free([(first, OK)]) == 0  # once only
    assert f.ack([first]) == 1
    assert in_flight(f, "a.test") == 1  # the ack gave nothing back a second time
    assert f.lease("w3", 10) == []
    conserved(f)


@pytest.mark.parametrize("end", ["ack", "nack", "dead", "release", "expiry", "release_worker"])
def test_no_way_a_lease_ends_gives_a_freed_slot_back_twice(
    make_frontier: FrontierFactory, clock: Clock, end: str
) -> None:
    f = polite(make_frontier, politeness_concurrency=2, lease_ttl=5.0)
    f.push(site("a.test", 6))
    one, two = f.lease("w1", 10)
    assert f.free([(one, OK)]) == 1
    assert in_flight(f, "a.test") == 1
    (three,) = f.lease("w2", 10)
    assert in_flight(f, "a.test") == 2
    # w1's leases end, the freed one and the other
    if end == "ack":
        assert f.ack([one, two]) == 2
    elif end == "nack":
        assert f.nack(one, "boom") == "retried" and f.nack(two, "boom") == "retried"
    elif end == "dead":
        assert f.dead_letter(one, "boom") == "dead" and f.dead_letter(two, "boom") == "dead"
    elif end == "release":
        assert f.release([one, two]) == 2
    elif end == "expiry":
        f.renew("w2", 60)
        clock.advance(6)
        f.maintain()
    else:
        f.release_worker("w1")
    assert in_flight(f, "a.test") == 1  # only w2's, freed never, counted once
    assert f.free([(three, OK)]) == 1
    assert in_flight(f, "a.test") == 0
    conserved(f)


def test_free_in_settle_lets_the_same_call_lease_the_slot(make_frontier: FrontierFactory) -> None:
    f = polite(make_frontier, politeness_concurrency=1)
    f.push(site("a.test", 3))
    (first,) = f.lease("w1", 10)
    out = f.settle(free=[(first, OK)], lease=("w1", 5))
    assert [x.envelope.url for x in out.leases] == ["http://a.test/p1"]
    out = f.settle(ack=[first], free=[(out.leases[0], OK)], lease=("w1", 5))
    assert out.acked == 1 and len(out.leases) == 1
    conserved(f)


def test_a_stale_lease_frees_nothing(make_frontier: FrontierFactory, clock: Clock) -> None:
    f = polite(make_frontier, politeness_concurrency=1, lease_ttl=5.0)
    f.push(site("a.test", 2))
    (first,) = f.lease("w1", 10)
    clock.advance(6)
    (again,) = f.lease("w2", 10)  # first's lease expired: the same request, w2's now
    assert again.id == first.id
    assert f.free([(first, OK)]) == 0
    assert in_flight(f, "a.test") == 1
    conserved(f)


def test_without_politeness_free_is_a_no_op_and_defer_refused(
    make_frontier: FrontierFactory,
) -> None:
    f = make_frontier(politeness=False)
    f.push(site("a.test", 1))
    (lease,) = f.lease("w", 1)
    assert f.free([(lease, OK)]) == 0
    with pytest.raises(FrontierError, match="politeness"):
        f.defer(lease, "429")
    assert f.politeness_stats() == {}


def test_defer_requeues_in_front_without_an_attempt_and_blocks_the_key(
    make_frontier: FrontierFactory, clock: Clock
) -> None:
    f = polite(make_frontier, politeness_concurrency=2)
    f.push(site("a.test", 4) + site("b.test", 2))
    got = f.lease("w1", 10)
    first = next(x for x in got if x.envelope.url == "http://a.test/p0")
    assert first.attempts == 1
    assert f.defer(first, "429", retry_after=3.0) == "deferred"
    assert f.client.hget(f.keys.stats, "deferred_429") == b"1"
    st = state(f, "a.test")
    assert int(st["block"]) == clock.ms + 3000 and st["fail"] == "1"
    assert f.client.zscore(f.keys.pol_blocked, "a.test") == clock.ms + 3000
    assert f.politeness_stats()["blocked"] == 1
    assert in_flight(f, "a.test") == 1
    conserved(f)
    f.ack([x for x in got if x is not first])
    assert all("a.test" not in x.envelope.url for x in f.lease("w2", 10))
    clock.advance(2.9)
    assert all("a.test" not in x.envelope.url for x in f.lease("w2", 10))
    clock.advance(0.1)
    again = f.lease("w2", 1)
    assert [x.envelope.url for x in again] == ["http://a.test/p0"]  # front of its queue
    assert again[0].attempts == 1  # no attempt spent
    assert f.politeness_stats()["blocked"] == 0
    assert f.client.zcard(f.keys.pol_blocked) == 0  # pruned by the lease step
    conserved(f)


def test_deferrals_are_capped_then_dead_with_the_reason(
    make_frontier: FrontierFactory, clock: Clock
) -> None:
    f = polite(make_frontier, politeness_concurrency=1, max_deferrals=2, max_attempts=1)
    f.push(site("a.test", 1))
    for n in (1, 2):
        (lease,) = f.lease("w", 1)
        assert lease.attempts == 1  # max_attempts 1: a spent attempt would kill it
        assert f.defer(lease, "503") == "deferred"
        assert f.client.hget(f.keys.deferrals, lease.id) == str(n).encode()
        clock.advance(400)  # past any backoff
    (lease,) = f.lease("w", 1)
    assert f.defer(lease, "503") == "dead"
    (dead,) = f.dead()
    assert dead.error.startswith("deferred 3 times (503)")
    assert f.client.hexists(f.keys.deferrals, lease.id) == 0
    assert in_flight(f, "a.test") == 0
    assert f.counts().dead == 1
    conserved(f)
    # requeued from DEAD: deferrals start again from zero
    assert f.requeue_dead() == 1
    clock.advance(400)
    (lease,) = f.lease("w", 1)
    assert f.defer(lease, "503") == "deferred"
    assert f.client.hget(f.keys.deferrals, lease.id) == b"1"


def test_defer_of_a_stale_lease_changes_nothing(
    make_frontier: FrontierFactory, clock: Clock
) -> None:
    f = polite(make_frontier, politeness_concurrency=1)
    f.push(site("a.test", 1))
    (lease,) = f.lease("w", 1)
    assert f.ack([lease]) == 1
    assert f.defer(lease, "429", retry_after=5) == "stale"
    assert "block" not in state(f, "a.test")
    assert f.client.hget(f.keys.stats, "deferred_429") is None
    conserved(f)


def test_defer_after_free_gives_no_slot_back_twice(make_frontier: FrontierFactory) -> None:
    f = polite(make_frontier, politeness_concurrency=2)
    f.push(site("a.test", 4))
    one, two = f.lease("w", 10)
    assert f.free([(one, OK)]) == 1
    assert f.defer(one, "429", retry_after=1) == "deferred"
    assert in_flight(f, "a.test") == 1  # two's
    assert f.defer(two, "429", retry_after=1) == "deferred"
    assert in_flight(f, "a.test") == 0
    assert f.counts().ready == 4
    conserved(f)


def test_backoff_without_retry_after_grows_and_success_forgives(
    make_frontier: FrontierFactory, clock: Clock
) -> None:
    policy = BackoffPolicy()
    f = polite(make_frontier, politeness_concurrency=1)
    f.push(site("a.test", 40))
    for n in (1, 2, 3):
        (lease,) = f.lease("w", 1)
        assert f.defer(lease, "503") == "deferred"
        block = int(state(f, "a.test")["block"]) - clock.ms
        low = policy.delay(BackoffState(failures=n), rand=0.0) * 1000
        high = policy.delay(BackoffState(failures=n), rand=1.0) * 1000
        assert low - 1 <= block <= high + 1, (n, block)
        assert state(f, "a.test")["fail"] == str(n)
        clock.advance(high / 1000 + 0.001)
    # successes at response time forgive: every forgive_after take one failure off
    for _ in range(policy.forgive_after):
        (lease,) = f.lease("w", 1)
        f.free([(lease, OK)])
        f.ack([lease])
    assert state(f, "a.test")["fail"] == "2" and state(f, "a.test")["ok"] == "0"
    conserved(f)


def test_one_episode_counts_once(make_frontier: FrontierFactory, clock: Clock) -> None:
    """Requests in flight when a site starts refusing fail together: one failure."""
    f = polite(make_frontier, politeness_concurrency=3)
    f.push(site("a.test", 6))
    a, b, c = f.lease("w", 10)
    assert f.defer(a, "503") == "deferred"
    clock.advance(0.1)
    assert f.defer(b, "503") == "deferred"
    assert f.free([(c, slot_outcome(503, pushed_back=True, retry_after=30))]) == 1
    st = state(f, "a.test")
    assert st["fail"] == "1"
    assert int(st["block"]) == clock.ms + 30_000  # a longer Retry-After still lengthens it
    conserved(f)


def test_a_pushed_back_response_not_deferred_blocks_at_free(
    make_frontier: FrontierFactory, clock: Clock
) -> None:
    f = polite(make_frontier, politeness_concurrency=2)
    f.push(site("a.test", 4))
    one, _two = f.lease("w", 10)
    assert f.free([(one, slot_outcome(429, pushed_back=True, retry_after=2))]) == 1
    assert f.lease("w", 10) == []  # blocked, though a slot is free
    clock.advance(2)
    assert len(f.lease("w", 10)) == 1
    conserved(f)


def test_a_block_at_free_holds_for_the_lease_of_the_same_settle(
    make_frontier: FrontierFactory, clock: Clock
) -> None:
    # (a key with no delay is granted and given slots back without reading its block while
    # no key of the crawl is blocked: a block set earlier in the same call must count,
    # also when the call's reclaim gives the key's last slot back after it)
    f = polite(make_frontier, politeness_concurrency=2)
    f.push(site("a.test", 4))
    f.lease("gone", 1, ttl=0.5)
    (mine,) = f.lease("w", 1, ttl=60)
    clock.advance(0.6)  # the first lease expired, its worker gone
    blocked = slot_outcome(429, pushed_back=True, retry_after=2)
    out = f.settle(free=[(mine, blocked)], lease=("w", 10), ttl=60)
    assert out.leases == []  # blocked, though both slots are free
    assert f.lease("w", 10, ttl=60) == []
    clock.advance(2)
    assert f.lease("w", 10, ttl=60)  # (streams: the expired entry is reclaimed by Redis's clock)
    conserved(f)


def test_block_and_override_block_until_both_hold(
    make_frontier: FrontierFactory, clock: Clock
) -> None:
    f = polite(make_frontier, politeness_concurrency=2)
    f.client.hset(f.keys.pol_override, "a.test", json.dumps({"block_until": clock.ms + 5000}))
    f.push(site("a.test", 4))
    clock.advance(4.9)
    assert f.lease("w", 10) == []
    clock.advance(0.1)
    (lease,) = f.lease("w", 1)
    f.defer(lease, "429", retry_after=3)
    clock.advance(2.9)
    assert f.lease("w", 10) == []
    clock.advance(0.1)
    assert len(f.lease("w", 10)) == 2


def test_politeness_wait_counts_the_time_keys_were_closed(
    make_frontier: FrontierFactory, clock: Clock
) -> None:
    f = polite(make_frontier, politeness_concurrency=10, politeness_delay=1.0)
    f.push(site("a.test", 3))
    assert len(f.lease("w", 10)) == 1  # no wait: it had just arrived
    assert f.politeness_stats()["politeness_wait_ms"] == 0
    clock.advance(1.5)  # due after 1 s; 0.5 s late is the fleet's, not politeness
    assert len(f.lease("w", 10)) == 1
    assert f.politeness_stats()["politeness_wait_ms"] == 1000
    clock.advance(1)
    assert len(f.lease("w", 10)) == 1
    assert f.politeness_stats()["politeness_wait_ms"] == 2000


def test_a_start_window_adds_to_the_spacing_of_keys_with_a_delay(
    make_frontier: FrontierFactory, clock: Clock
) -> None:
    f = polite(make_frontier, politeness_concurrency=10, politeness_delay=1.0)
    f.client.hset(f.keys.control, "start_window", 30)  # as a Scrapy worker stores it
    f.push(site("a.test", 3))
    assert len(f.lease("w", 10)) == 1
    assert int(state(f, "a.test")["next"]) == clock.ms + 1030
    clock.advance(1.0)
    assert f.lease("w", 10) == []
    clock.advance(0.03)
    assert len(f.lease("w", 10)) == 1


def test_a_start_window_is_stored_by_workers_only(make_frontier: FrontierFactory) -> None:
    f = polite(make_frontier, politeness_start_window=0.05)
    f.store_politeness()
    assert f.client.hget(f.keys.control, "start_window") is None
    f.store_politeness(worker=True)
    assert f.client.hget(f.keys.control, "start_window") == b"50"


def test_a_record_marked_freed_at_rest_still_takes_and_gives_back_its_slot(
    make_frontier: FrontierFactory,
) -> None:
    # (lists crawls' leases write no record: one at rest is "K", as every way out of a
    # lease leaves it; a "k" one from elsewhere must not keep its key's slot for good)
    f = polite(make_frontier, politeness_concurrency=1)
    f.push(site("a.test", 2))
    for rid, rec in f.client.hgetall(f.keys.req).items():
        assert isinstance(rec, bytes)
        head = rec.split(b"|", 3)
        f.client.hset(f.keys.req, rid, b"|".join(head[:3]) + b"|k" + head[3][1:])
    (a,) = f.lease("w", 5, ttl=60)
    assert held_with_slot(f, a) and f.ack([a]) == 1
    assert in_flight(f, "a.test") == 0
    assert len(f.lease("w", 5, ttl=60)) == 1
    conserved(f)
