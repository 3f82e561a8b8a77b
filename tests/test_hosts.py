"""Operators' view and steering of politeness keys (redcrawl.politeness.hosts), against a
real Redis: what is listed and shown, why a key is not served, and that an override
written here is obeyed by the lease step at once (lists backend with politeness)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
import redis

from redcrawl.codec import Envelope
from redcrawl.fingerprint import fingerprint
from redcrawl.frontier import FrontierCore
from redcrawl.politeness.hosts import (
    LIST_KEYS_PER_TIER,
    BadHostInput,
    Hosts,
    PolitenessOff,
    check_key,
)
from redcrawl.politeness.robots import RobotsEntry

from .conftest import Clock, FrontierFactory

pytestmark = pytest.mark.backends("lists", "streams")

T = TypeVar("T")


def site(host: str, n: int) -> list[Envelope]:
    return [
        Envelope(url=f"http://{host}/p{i}", fingerprint=fingerprint(f"http://{host}/p{i}"))
        for i in range(n)
    ]


def polite(make_frontier: FrontierFactory, **settings: object) -> FrontierCore:
    params: dict[str, object] = {
        "politeness_concurrency": 2,
        "politeness_delay": 0.0,
        "politeness_randomize": False,
    }
    f = make_frontier(**{**params, **settings})
    assert f.politeness == "host"
    return f


def granted(f: FrontierCore, host: str, n: int = 100) -> int:
    return sum(1 for lease in f.lease("w", n) if lease.envelope.url.split("/")[2] == host)


# --- the lease step obeys an override at once ------------------------------------------


def test_override_set_here_is_obeyed_by_the_next_lease(make_frontier: FrontierFactory) -> None:
    f = polite(make_frontier)
    f.push(site("a.test", 10))
    h = Hosts(f)
    h.set("a.test", concurrency=1)
    assert granted(f, "a.test") == 1
    assert h.show("a.test").why == "its only slot is in flight"
    f.ack(f.lease("nobody", 0))  # (nothing)
    # a raised concurrency opens the key at once, though it was scored "full"
    h.set("a.test", concurrency=3)
    assert granted(f, "a.test") == 2
    h.set("a.test", concurrency=10, block_for=600)
    assert granted(f, "a.test") == 0
    assert str(h.show("a.test").why).startswith("blocked by operator until ")
    h.set("a.test", block_until=None)  # unblock: served at the next lease
    assert granted(f, "a.test") == 7
    assert f.counts().conserved


def test_pause_and_resume_a_key(make_frontier: FrontierFactory) -> None:
    f = polite(make_frontier)
    f.push(site("a.test", 3) + site("b.test", 3))
    h = Hosts(f)
    h.set("a.test", paused=True)
    assert granted(f, "a.test", 1) == 0
    assert h.show("a.test").why == "paused by operator (redcrawl hosts set KEY --resume)"
    h.set("a.test", paused=False)
    assert h.show("a.test").why is None
    assert granted(f, "a.test") == 2


def test_a_lowered_delay_counts_from_now(make_frontier: FrontierFactory, clock: Clock) -> None:
    f = polite(make_frontier, politeness_delay=60.0, politeness_concurrency=10)
    f.push(site("a.test", 3))
    h = Hosts(f)
    assert granted(f, "a.test", 1) == 1
    assert granted(f, "a.test", 1) == 0
    assert h.show("a.test").why == "delay: next fetch allowed in 60.0 s"
    d = h.set("a.test", delay=0.5)
    assert (d.delay.value, d.delay.source) == (0.5, "override")
    assert granted(f, "a.test", 1) == 0  # within half a second of now: not yet
    clock.advance(0.6)
    assert granted(f, "a.test", 1) == 1
    # dropping the override falls back to the crawl's 60 s, from the next grant on
    clock.advance(1)
    h.reset("a.test")
    assert granted(f, "a.test", 1) == 1
    clock.advance(30)
    assert granted(f, "a.test", 1) == 0
    assert h.show("a.test").delay.source == "default"


def test_reset_keeps_what_robots_and_autothrottle_wrote(make_frontier: FrontierFactory) -> None:
    f = polite(make_frontier, politeness_delay=0.5)
    f.push(site("a.test", 1))
    f.client.hset(f.keys.pol_override, "a.test", json.dumps({"crawl_delay": 2.0}))
    h = Hosts(f)
    d = h.show("a.test")
    assert (d.delay.value, d.delay.source, d.crawl_delay) == (2.0, "crawl_delay", 2.0)
    h.set("a.test", delay=0.1, concurrency=4, block_for=60, paused=True)
    stored = json.loads(f.client.hget(f.keys.pol_override, "a.test"))
    assert stored["crawl_delay"] == 2.0 and stored["delay"] == 0.1 and stored["paused"] is True
    # AutoThrottle's delay (the key's state, field "ad", ms) counts while it is on (its
    # settings in the control hash)
    f.client.hset(f.keys.pol_state_base + "a.test", "ad", 3000)
    f.client.hset(f.keys.control, "autothrottle", json.dumps({"start_delay": 5.0}))
    d = h.reset("a.test")
    assert json.loads(f.client.hget(f.keys.pol_override, "a.test")) == {"crawl_delay": 2.0}
    assert (d.delay.value, d.delay.source, d.override) == (3.0, "auto_delay", {})
    assert d.auto_delay == 3.0
    f.client.hdel(f.keys.pol_state_base + "a.test", "ad")
    assert (h.show("a.test").delay.value, h.show("a.test").delay.source) == (5.0, "auto_delay")
    assert h.show("a.test").auto_delay is None
    f.client.hdel(f.keys.control, "autothrottle")
    assert h.show("a.test").delay.source == "crawl_delay"
    f.client.hset(f.keys.pol_override, "a.test", json.dumps({"delay": 1}))
    h.reset("a.test")
    assert f.client.hget(f.keys.pol_override, "a.test") is None  # nothing left: no field


def test_an_unreadable_override_is_replaced_by_the_operators(
    make_frontier: FrontierFactory,
) -> None:
    f = polite(make_frontier)
    f.push(site("a.test", 1))
    f.client.hset(f.keys.pol_override, "a.test", "[not an object")
    h = Hosts(f)
    assert h.show("a.test").notes
    h.set("a.test", concurrency=1)
    assert json.loads(f.client.hget(f.keys.pol_override, "a.test")) == {"concurrency": 1}


# --- what is shown ----------------------------------------------------------------------


def test_list_sorts_by_ready_or_in_flight_and_pages(make_frontier: FrontierFactory) -> None:
    f = polite(make_frontier)
    f.push(site("a.test", 5) + site("b.test", 3) + site("c.test", 1))
    f.lease("w", 5)  # two of a, two of b (their limit, granted together), one of c
    h = Hosts(f)
    page = h.top(limit=2)
    assert [r.key for r in page.hosts] == ["a.test", "b.test"]
    assert page.complete and page.scanned == 3 and page.next_cursor == "2"
    rest = h.top(limit=2, cursor=page.next_cursor)
    assert [r.key for r in rest.hosts] == ["c.test"] and rest.next_cursor is None
    # c.test has nothing ready, only in flight: found through the leases
    by_flight = h.top(sort="inflight")
    top = by_flight.hosts[0]
    assert (top.key, top.in_flight) == ("a.test", 2)
    row = {r.key: r for r in by_flight.hosts}["c.test"]
    assert (row.ready, row.in_flight) == (0, 1)


def test_list_is_bounded_and_says_so(make_frontier: FrontierFactory) -> None:
    f = polite(make_frontier)
    f.push([e for i in range(LIST_KEYS_PER_TIER + 5) for e in site(f"h{i}.test", 1)])
    page = Hosts(f).top(limit=10)
    assert not page.complete and page.scanned == LIST_KEYS_PER_TIER
    assert len(page.hosts) == 10


def test_show_explains_each_reason(make_frontier: FrontierFactory, clock: Clock) -> None:
    f = polite(make_frontier, politeness_slots={"slow.test": {"concurrency": 1, "delay": 5}})
    f.push(site("a.test", 1) + site("slow.test", 2))
    h = Hosts(f)
    assert h.show("a.test").why is None
    assert h.show("nothing.test").why == "no ready requests"
    slow = h.show("slow.test")
    assert (slow.concurrency.value, slow.concurrency.source) == (1, "DOWNLOAD_SLOTS")
    assert (slow.delay.value, slow.delay.source) == (5, "DOWNLOAD_SLOTS")
    f.lease("w", 10)
    assert h.show("a.test").why == "no ready requests (1 in flight)"
    # an adaptive block (written by the 429/503 handling into the key's state)
    f.client.hset(f.keys.pol_state_base + "slow.test", mapping={"block": clock.ms + 3000})
    assert str(h.show("slow.test").why).startswith("blocked after 429/503 responses until ")
    f.pause()
    assert str(h.show("slow.test").why).startswith("the whole crawl is paused")


def test_show_gives_the_robots_txt_state(make_frontier: FrontierFactory) -> None:
    f = polite(make_frontier)
    f.client.hset(f.keys.robots, "https://a.test", RobotsEntry(404).encode())
    f.client.zadd(f.keys.robots_expiry, {"https://a.test": 2_000_000_000_000})
    (robots,) = Hosts(f).show("a.test").robots
    assert (robots.origin, robots.status, robots.kind, robots.expires_at) == (
        "https://a.test",
        404,
        "allow",
        2_000_000_000.0,
    )


# --- bad input --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"delay": -1}, "delay"),
        ({"delay": math.nan}, "delay"),
        ({"delay": math.inf}, "delay"),
        ({"delay": 86401}, "delay"),
        ({"delay": "2"}, "delay"),
        ({"concurrency": 0}, "concurrency"),
        ({"concurrency": 10001}, "concurrency"),
        ({"concurrency": 1.5}, "concurrency"),
        ({"concurrency": True}, "concurrency"),
        ({"block_for": 0}, "block_for"),
        ({"block_for": 31 * 86400}, "block_for"),
        ({"block_until": 1.0}, "block_until"),
        ({"block_until": 4e12}, "block_until"),  # ms, not seconds
        ({"block_until": math.nan}, "block_until"),
        ({"block_until": None, "block_for": 5}, "block_for"),
    ],
)
def test_bad_values_are_refused_naming_the_field(
    make_frontier: FrontierFactory, change: dict[str, object], field: str
) -> None:
    f = polite(make_frontier)
    with pytest.raises(BadHostInput) as err:
        Hosts(f).set("a.test", **change)  # type: ignore[arg-type]
    assert err.value.field == field
    assert f.client.hget(f.keys.pol_override, "a.test") is None


@pytest.mark.parametrize("key", ["", "x" * 256, "é" * 128, "a\nb", 7])
def test_bad_keys(key: object) -> None:
    with pytest.raises(BadHostInput) as err:
        check_key(key)
    assert err.value.field == "key"


def test_a_crawl_without_politeness_is_refused(
    make_frontier: FrontierFactory, redis_client: redis.Redis
) -> None:
    f = make_frontier(politeness=False)
    with pytest.raises(PolitenessOff, match="no fleet-wide politeness"):
        Hosts(f)


def test_keys_in_flight_are_found_in_a_large_lease(make_frontier: FrontierFactory) -> None:
    f = polite(make_frontier, politeness_concurrency=3000)
    f.push(site("big.test", 1500) + site("other.test", 1))
    assert len(f.lease("w", 1500)) == 1500
    page = Hosts(f).top(sort="inflight")
    assert page.complete and page.hosts[0].key == "big.test"
    assert sum(r.in_flight for r in page.hosts) == 1500


# --- many keys in one round trip (the dashboard's and `redcrawl top`'s hosts panel) ------


class CountingConnection(redis.Connection):
    """A real connection that counts what it sends: one ``send_packed_command`` is one
    round trip (a pipeline sends all its commands at once)."""

    sent = 0

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        type(self).sent += 1
        super().send_packed_command(command, check_health)


def counting_frontier(redis_client: redis.Redis, clock: Clock) -> FrontierCore:
    from redcrawl.frontier import open_frontier
    from redcrawl.settings import Settings

    kw = redis_client.connection_pool.connection_kwargs
    pool = redis.ConnectionPool(
        connection_class=CountingConnection, host=kw["host"], port=kw["port"], db=kw["db"]
    )
    s = Settings(politeness_concurrency=2, politeness_delay=0.5, politeness_randomize=False)
    return open_frontier(redis.Redis(connection_pool=pool), s, "many", clock=clock)


def round_trips(fn: Callable[[], T]) -> tuple[T, int]:
    before = CountingConnection.sent
    result = fn()
    return result, CountingConnection.sent - before


def test_show_many_reads_every_key_in_one_round_trip_as_show_reads_each(
    redis_client: redis.Redis, clock: Clock
) -> None:
    f = counting_frontier(redis_client, clock)
    hosts = [f"h{i}.test" for i in range(30)]
    f.push([e for host in hosts for e in site(host, 3)])
    f.lease("w", 10)
    h = Hosts(f)
    h.set("h3.test", delay=2.0, block_for=60)
    h.set("h4.test", paused=True)
    f.client.hset(f.keys.robots, "http://h5.test", RobotsEntry(200, b"").encode())
    keys = [*hosts, "never.test", "bad\nkey", "h1.test"]
    many, trips = round_trips(lambda: h.show_many(keys))
    assert trips == 1
    # every good key once, in the order given; the refused one left out
    assert list(many) == [*hosts, "never.test"]
    assert many == {k: h.show(k) for k in many}
    assert many["h3.test"].why is not None and many["h3.test"].why.startswith("blocked by")
    assert many["h4.test"].paused and many["h5.test"].robots[0].status == 200
    assert many["never.test"].ready == 0 and many["never.test"].why == "no ready requests"
    assert h.show_many([]) == {}
    with pytest.raises(BadHostInput) as bad:
        h.show_many(["k"] * 1001)
    assert bad.value.field == "keys"


def test_the_hosts_panel_costs_the_same_round_trips_for_5_and_for_30_keys(
    redis_client: redis.Redis, clock: Clock
) -> None:
    from redcrawl.metrics.hosts_view import read_hosts

    f = counting_frontier(redis_client, clock)
    f.push([e for i in range(40) for e in site(f"h{i}.test", 2)])
    f.lease("w", 5)
    read_hosts(f, limit=1)  # the scripts loaded (SCRIPT LOAD: once per process)
    few, few_trips = round_trips(lambda: read_hosts(f, limit=5))
    many, many_trips = round_trips(lambda: read_hosts(f, limit=30))
    assert few is not None and many is not None
    assert (len(few.hosts), len(many.hosts)) == (5, 30)
    assert few_trips == many_trips <= 4, (few_trips, many_trips)
    assert all(line.delay == 0.5 and line.concurrency == 2 for line in many.hosts)


def test_a_key_no_request_has_is_said_so(make_frontier: FrontierFactory) -> None:
    """An operator's override on a key nobody leases (``127.0.0.1:8080`` where keys are
    hosts without their port) was stored without a word (an operator trial)."""
    f = polite(make_frontier)
    f.push(site("a.test", 2))
    h = Hosts(f)
    (note,) = h.set("127.0.0.1:8080", concurrency=1).notes
    assert "no request of the crawl has this key" in note and "without their port" in note
    (note,) = h.show("b.test").notes
    assert "no request of the crawl has this key" in note and "port" not in note
    assert h.show("a.test").notes == []
    f.ack(f.lease("w", 10))
    assert h.show("a.test").notes == []  # (it had requests: its state says so)


def test_the_list_reads_many_leased_requests_in_steps_and_misses_none(
    make_frontier: FrontierFactory,
) -> None:
    """2,500 requests in flight, one per host, under leases of 300: the list reads their
    records in steps of LIST_STEP_IDS (each one Lua call, bounded), going on where the
    last stopped (inside a lease, or inside a stream's pending entries), and finds every
    host once, complete."""
    f = polite(make_frontier)
    hosts = [f"h{i}.test" for i in range(2500)]
    f.push([env for h in hosts for env in site(h, 1)])
    for w in range(9):
        f.lease(f"w{w}", 300)
    assert f.counts().in_flight == 2500
    h = Hosts(f)
    listed: list[str] = []
    cursor = None
    while True:
        page = h.top(limit=1000, sort="inflight", cursor=cursor)
        assert page.complete and page.scanned == 2500, (page.complete, page.scanned)
        listed += [row.key for row in page.hosts]
        assert all(row.in_flight == 1 for row in page.hosts)
        cursor = page.next_cursor
        if cursor is None:
            break
    assert sorted(listed) == sorted(hosts)
