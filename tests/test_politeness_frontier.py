"""Fleet-wide politeness enforced by the frontier at lease time (both backends), against a
real Redis: concurrency per politeness key, slots given back by every way a lease ends,
delay spacing on an injected clock, idle state expiry, overrides, bad keys and layouts."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import redis

from redcrawl.codec import Envelope
from redcrawl.errors import EncodeError, FrontierError
from redcrawl.fingerprint import fingerprint
from redcrawl.frontier import FrontierCore, Lease

from .conftest import Clock, FrontierFactory

pytestmark = pytest.mark.backends("lists", "streams")


def env(url: str, priority: int = 0, **meta: object) -> Envelope:
    return Envelope(url=url, fingerprint=fingerprint(url), priority=priority, meta=dict(meta))


def site(host: str, n: int, start: int = 0) -> list[Envelope]:
    return [env(f"http://{host}/p{i}") for i in range(start, start + n)]


def hosts(leases: list[Lease]) -> Counter[str]:
    return Counter(lease.envelope.url.split("/")[2] for lease in leases)


def in_flight(f: FrontierCore, key: str) -> int:
    return int(f.client.hget(f.keys.pol_state_base + key, "in") or 0)


def conserved(f: FrontierCore) -> None:
    c = f.counts()
    assert c.conserved, c


def polite(make_frontier: FrontierFactory, **settings: object) -> FrontierCore:
    params: dict[str, object] = {
        "politeness_concurrency": 2,
        "politeness_delay": 0.0,
        "politeness_randomize": False,
    }
    f = make_frontier(**{**params, **settings})
    assert f.politeness == "host"
    return f


def test_concurrency_per_key_holds_across_workers(make_frontier: FrontierFactory) -> None:
    f = polite(make_frontier)
    f.push(site("a.test", 10) + site("b.test", 10) + site("c.test", 1))
    got = f.lease("w1", 100) + f.lease("w2", 100)
    assert hosts(got) == {"a.test": 2, "b.test": 2, "c.test": 1}
    assert f.lease("w3", 100) == []
    assert f.counts().ready == 16
    conserved(f)
    # one slot of a.test back: exactly one more a.test request
    f.ack([next(x for x in got if "a.test" in x.envelope.url)])
    assert hosts(f.lease("w3", 100)) == {"a.test": 1}
    assert in_flight(f, "a.test") == 2 and in_flight(f, "b.test") == 2
    conserved(f)


def test_slots_come_back_on_nack_release_expiry_and_release_worker(
    make_frontier: FrontierFactory, clock: Clock
) -> None:
    f = polite(make_frontier, politeness_concurrency=1, lease_ttl=5.0)
    f.push(site("a.test", 10))
    (first,) = f.lease("w1", 10)
    assert f.lease("w2", 10) == []
    f.nack(first, "boom", retry=True)
    assert in_flight(f, "a.test") == 0
    (second,) = f.lease("w2", 10)
    assert f.release([second]) == 1
    assert in_flight(f, "a.test") == 0
    (third,) = f.lease("w3", 10)
    assert f.lease("w4", 10) == []
    clock.advance(6)  # w3's lease expires, its heartbeat too
    (fourth,) = f.lease("w4", 10)
    assert fourth.worker == "w4"
    assert in_flight(f, "a.test") == 1
    f.release_worker("w4")
    (fifth,) = f.lease("w5", 10)
    assert in_flight(f, "a.test") == 1
    f.ack([fifth])
    assert in_flight(f, "a.test") == 0
    conserved(f)
    assert third.token != fifth.token


def test_delay_spaces_grants_on_the_frontier_clock(
    make_frontier: FrontierFactory, clock: Clock
) -> None:
    f = polite(make_frontier, politeness_concurrency=10, politeness_delay=1.0)
    f.push(site("a.test", 5) + site("b.test", 5))
    assert hosts(f.lease("w", 10)) == {"a.test": 1, "b.test": 1}
    assert f.lease("w", 10) == []
    clock.advance(0.5)
    assert f.lease("w", 10) == []
    clock.advance(0.5)
    assert hosts(f.lease("w", 10)) == {"a.test": 1, "b.test": 1}
    conserved(f)


def test_randomized_delay_stays_within_half_to_one_and_a_half(
    make_frontier: FrontierFactory, clock: Clock
) -> None:
    f = polite(
        make_frontier, politeness_concurrency=100, politeness_delay=1.0, politeness_randomize=True
    )
    f.push(site("a.test", 40))
    gaps = []
    for _ in range(30):
        assert len(f.lease("w", 10)) == 1
        nxt = int(f.client.hget(f.keys.pol_state_base + "a.test", "next"))
        gaps.append(nxt - clock.ms)
        clock.ms = nxt
    assert all(500 <= g < 1500 for g in gaps), gaps
    assert len(set(gaps)) > 10


def test_idle_key_state_expires(make_frontier: FrontierFactory) -> None:
    f = polite(make_frontier)
    f.push(site("a.test", 1))
    (lease,) = f.lease("w", 10)
    key = f.keys.pol_state_base + "a.test"
    assert f.client.pttl(key) == -1  # in use: kept
    f.ack([lease])
    assert 0 < f.client.pttl(key) <= 3_600_000
    f.push(site("a.test", 1, start=5))
    f.lease("w", 10)
    assert f.client.pttl(key) == -1  # in use again: kept


def test_overrides_concurrency_delay_pause_and_block(
    make_frontier: FrontierFactory, clock: Clock
) -> None:
    f = polite(make_frontier, politeness_concurrency=5)
    polo = f.keys.pol_override
    f.client.hset(polo, "a.test", json.dumps({"concurrency": 1}))
    f.client.hset(polo, "b.test", json.dumps({"paused": True}))
    f.client.hset(polo, "c.test", json.dumps({"block_until": clock.ms + 10_000}))
    f.client.hset(polo, "d.test", json.dumps({"crawl_delay": 2.0}))
    f.push(site("a.test", 5) + site("b.test", 5) + site("c.test", 5) + site("d.test", 5))
    assert hosts(f.lease("w", 100)) == {"a.test": 1, "d.test": 1}
    clock.advance(2)
    assert hosts(f.lease("w", 100)) == {"d.test": 1}
    f.client.hdel(polo, "b.test")  # resumed: served within the pause recheck
    clock.advance(1)
    assert hosts(f.lease("w", 100)) == {"b.test": 5}
    clock.advance(8)  # the block is over
    assert hosts(f.lease("w", 100))["c.test"] == 5
    conserved(f)


def test_override_delay_wins_and_crawl_delay_only_when_larger(
    make_frontier: FrontierFactory, clock: Clock
) -> None:
    f = polite(make_frontier, politeness_concurrency=5, politeness_delay=1.0)
    polo = f.keys.pol_override
    f.client.hset(polo, "a.test", json.dumps({"crawl_delay": 0.2}))  # smaller: 1.0 wins
    f.client.hset(polo, "b.test", json.dumps({"crawl_delay": 3.0, "delay": 0.5}))
    f.push(site("a.test", 5) + site("b.test", 5))
    assert hosts(f.lease("w", 100)) == {"a.test": 1, "b.test": 1}
    clock.advance(0.5)
    assert hosts(f.lease("w", 100)) == {"b.test": 1}
    clock.advance(0.5)
    assert hosts(f.lease("w", 100)) == {"a.test": 1, "b.test": 1}


def test_download_slots_and_meta_download_slot(make_frontier: FrontierFactory) -> None:
    f = polite(make_frontier, politeness_slots={"shared": {"concurrency": 3}})
    f.push(
        [env(f"http://h{i}.test/", download_slot="shared") for i in range(10)] + site("a.test", 10)
    )
    got = f.lease("w", 100)
    assert hosts(got)["a.test"] == 2
    assert sum(1 for x in got if x.envelope.url.startswith("http://h")) == 3


def test_unreadable_override_is_ignored(make_frontier: FrontierFactory) -> None:
    f = polite(make_frontier)
    f.client.hset(f.keys.pol_override, "a.test", b"{not json")
    f.client.hset(f.keys.pol_override, "b.test", json.dumps({"concurrency": -3, "delay": "soon"}))
    f.push(site("a.test", 5) + site("b.test", 5))
    assert hosts(f.lease("w", 100)) == {"a.test": 2, "b.test": 2}


def test_bad_download_slot_is_refused_at_push(make_frontier: FrontierFactory) -> None:
    f = polite(make_frontier)
    with pytest.raises(EncodeError, match="download_slot"):
        f.push([env("http://a.test/", download_slot=7)])
    f.push([env("data:,x"), env("http://[::1]:8080/"), env("http://A.Test:81/x")])
    assert len(f.lease("w", 100)) == 3
    for key in ("data:", "::1", "a.test"):
        assert in_flight(f, key) == 1


def test_priority_within_a_key_and_tiers_kept(make_frontier: FrontierFactory) -> None:
    f = polite(make_frontier, politeness_concurrency=1)
    f.push(
        [env("http://a.test/low", -5), env("http://a.test/mid", 0), env("http://a.test/high", 5)]
    )
    (lease,) = f.lease("w", 10)
    assert lease.envelope.url.endswith("/high")
    f.ack([lease])
    (lease,) = f.lease("w", 10)
    assert lease.envelope.url.endswith("/mid")


def test_old_crawl_keeps_its_layout(make_frontier: FrontierFactory) -> None:
    old = make_frontier(politeness=False)
    old.push(site("a.test", 10))
    again = make_frontier(politeness_concurrency=2)
    assert again.politeness is None
    assert len(again.lease("w", 100)) == 10


def test_politeness_off_leases_like_before(make_frontier: FrontierFactory) -> None:
    f = make_frontier(politeness=False, politeness_concurrency=1)
    f.push(site("a.test", 10))
    assert len(f.lease("w", 100)) == 10
    assert not f.client.exists(f.keys.open(0))


def test_purge_deletes_the_per_key_state(
    make_frontier: FrontierFactory, redis_client: redis.Redis
) -> None:
    f = polite(make_frontier)
    f.push(site("a.test", 5))
    f.lease("w", 1)
    f.purge()
    assert not list(redis_client.scan_iter(match=f.keys.pol_queue_base + "*"))
    assert not list(redis_client.scan_iter(match=f.keys.pol_state_base + "*"))
    assert f.counts().ready == 0


def test_domain_mode_groups_hosts_by_registrable_domain(make_frontier: FrontierFactory) -> None:
    f = make_frontier(politeness_key="domain", politeness_concurrency=1, politeness_delay=0.0)
    assert f.politeness == "domain"
    f.push([env("http://www.a.co.uk/1"), env("http://shop.a.co.uk/2"), env("http://b.example/3")])
    got = f.lease("w", 10)
    assert len(got) == 2
    assert in_flight(f, "a.co.uk") == 1 and in_flight(f, "b.example") == 1
    head = f.client.hget(f.keys.control, "layout").split(b" ")[0]
    assert head == (b"fifo/domain" if f.BACKEND == "lists" else b"streams/8/domain")


def test_a_worker_without_politeness_is_refused_on_a_polite_crawl(
    make_frontier: FrontierFactory,
) -> None:
    polite(make_frontier).push(site("a.test", 1))
    other = make_frontier(politeness=False)
    with pytest.raises(FrontierError, match="REDCRAWL_POLITENESS"):
        other.lease("w", 1)


def test_purge_of_many_keys(make_frontier: FrontierFactory, redis_client: redis.Redis) -> None:
    f = polite(make_frontier)
    for start in range(0, 12_000, 2000):
        f.push([env(f"http://h{i}.test/") for i in range(start, start + 2000)])
    f.purge()
    assert not list(redis_client.scan_iter(match=f.keys.pol_queue_base + "*"))
    assert f.counts().ready == 0


def test_next_open_tells_when_a_key_opens(make_frontier: FrontierFactory, clock: Clock) -> None:
    f = polite(make_frontier, politeness_concurrency=1, politeness_delay=2.0)
    assert f.next_open() is None
    f.push(site("a.test", 3) + site("b.test", 3))
    assert f.next_open() == 0.0
    got = f.lease("w", 10)
    assert len(got) == 2
    assert f.next_open() is None  # both full
    f.ack(got)
    assert f.next_open() == pytest.approx(2.0)
    clock.advance(0.5)
    assert f.next_open() == pytest.approx(1.5)
    assert make_frontier("x", politeness=False).next_open() is None
