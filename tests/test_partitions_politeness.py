"""Politeness of a partitioned crawl (``REDCRAWL_PARTITIONS`` = 4, one Redis server) is the
politeness of a one-partition crawl: robots.txt's Crawl-delay, operators' overrides
(``redcrawl hosts``, :class:`~redcrawl.politeness.hosts.Hosts`), fleet-wide AutoThrottle
and the 429/503 block are written to and read from the partition that owns the site's
politeness key, where its lease step looks (the sites here are in partitions other than
0). On a cluster with P = 16: tests/test_partitions_cluster.py."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis
from typer.testing import CliRunner

from redcrawl.cli import app
from redcrawl.frontier import FrontierCore, PartitionedFrontier, open_frontier
from redcrawl.keys import partition_of
from redcrawl.politeness.autothrottle import FleetThrottle, ThrottleRule, Update
from redcrawl.politeness.hosts import Hosts
from redcrawl.politeness.robots import RobotsCache, RobotsEntry
from redcrawl.settings import Settings

from .conftest import Clock, RedisServer
from .partition_helpers import hosts, hosts_in, lease_all, polite_crawl, site

P = 4
runner = CliRunner()


@pytest.fixture
def client(redis7_client: redis.Redis) -> redis.Redis:
    return redis7_client


def polite(client: redis.Redis, clock: Clock, partitions: int = P, crawl: str = "c") -> Any:
    f = polite_crawl(client, clock, crawl, partitions)
    assert f.politeness == "host"
    return f


def override_of(client: redis.Redis, polo: str, key: str) -> Any:
    raw: Any = client.hget(polo, key)
    return json.loads(raw) if raw is not None else None


def two_sites() -> tuple[str, str]:
    """A site in partition 2 and one in partition 3."""
    return hosts_in(2, P, 1, "a")[0], hosts_in(3, P, 1, "b")[0]


def test_robots_crawl_delay_is_enforced_in_the_sites_partition(
    client: redis.Redis, clock: Clock
) -> None:
    f = polite(client, clock)
    assert isinstance(f, PartitionedFrontier)
    slow, fast = two_sites()
    f.push(site(slow, 5) + site(fast, 5))
    cache = RobotsCache(client, f.keys, max_bytes=1 << 20)  # (P read from the crawl)
    origin = f"http://{slow}"
    assert cache.lookup([origin])[0].state == "fetch"
    body = b"User-agent: *\nCrawl-delay: 2\n"
    stored = cache.store(
        origin, RobotsEntry(200, body), ttl=60, politeness_key=slow, crawl_delay=2.0
    )
    assert (stored.stored, stored.override) == (True, 1)
    owner = f.parts[partition_of(slow, P)].keys
    assert override_of(client, owner.pol_override, slow) == {"crawl_delay": 2.0}
    assert client.hget(f.keys.pol_override, slow) is None  # (not the anchor's)
    assert cache.lookup([origin])[0].state == "cached"  # the cache is crawl-wide
    assert hosts(lease_all(f)) == {slow: 1, fast: 5}
    clock.advance(1.0)
    assert lease_all(f) == []
    clock.advance(1.0)
    assert hosts(lease_all(f)) == {slow: 1}
    assert Hosts(f).show(slow).delay.source == "crawl_delay"
    # robots.txt without a Crawl-delay clears it
    cache.store(origin, RobotsEntry(200, b""), ttl=60, politeness_key=slow, crawl_delay=None)
    assert client.hget(owner.pol_override, slow) is None


def test_hosts_override_is_set_read_and_enforced_in_the_sites_partition(
    client: redis.Redis, clock: Clock
) -> None:
    f = polite(client, clock)
    slow, fast = two_sites()
    f.push(site(slow, 6) + site(fast, 8))
    h = Hosts(f)
    detail = h.set(slow, concurrency=1, delay=3.0)
    assert (detail.concurrency.value, detail.concurrency.source) == (1, "override")
    assert (detail.delay.value, detail.delay.source) == (3.0, "override")
    assert detail.ready == 6
    owner = f.parts[partition_of(slow, P)].keys
    assert override_of(client, owner.pol_override, slow) == {"concurrency": 1, "delay": 3.0}
    held = lease_all(f)
    assert hosts(held) == {slow: 1, fast: 5}
    clock.advance(3.0)
    assert lease_all(f) == []  # every slot of both is in flight
    assert h.show(slow).why == "its only slot is in flight"
    h.set(fast, paused=True)
    f.ack(held)
    assert hosts(lease_all(f)) == {slow: 1}  # fast is paused
    h.reset(fast)
    assert hosts(lease_all(f)) == {fast: 3}


def test_hosts_list_covers_every_partition_like_one_partition(
    client: redis.Redis, clock: Clock
) -> None:
    one = polite(client, clock, partitions=1, crawl="one")
    parts = polite(client, clock, crawl="parts")
    names = [h for p in range(P) for h in hosts_in(p, P, 3, f"s{p}x")]
    for i, name in enumerate(names):
        for f in (one, parts):
            f.push(site(name, i + 1))
    for f in (one, parts):  # every site's 5 slots taken (which ones a lease takes first
        while f.lease("w", 1000):  # differs between the layouts)
            pass
    page_one, page_parts = Hosts(one).top(limit=100), Hosts(parts).top(limit=100)
    assert page_parts.complete and page_one.complete
    assert {p % P for p in (partition_of(r.key, P) for r in page_parts.hosts)} == set(range(P))
    strip = [(r.key, r.ready, r.in_flight) for r in page_one.hosts]
    assert [(r.key, r.ready, r.in_flight) for r in page_parts.hosts] == strip
    assert len(strip) == len(names)
    detail_one = Hosts(one).show_many(names)
    detail_parts = Hosts(parts).show_many(names)
    for name in names:
        a, b = detail_one[name], detail_parts[name]
        assert (a.ready, a.in_flight, a.delay, a.concurrency) == (
            b.ready,
            b.in_flight,
            b.delay,
            b.concurrency,
        )


def test_fleet_autothrottle_delay_is_kept_and_enforced_in_the_sites_partition(
    client: redis.Redis, clock: Clock
) -> None:
    f = polite(client, clock)
    slow, fast = two_sites()
    f.push(site(slow, 5) + site(fast, 5))
    rule = ThrottleRule(target_concurrency=1.0, min_delay=0.0, max_delay=60.0, start_delay=0.0)
    fleet = FleetThrottle(client, f.keys, rule)
    fleet.enable()
    for sub in f.parts:  # every partition's lease step sees the switch
        assert client.hget(sub.keys.control, "autothrottle") is not None
    applied = fleet.update([Update(slow, 2.0, 200), Update(fast, 0.0, 200)])
    assert [(a.key, a.new) for a in applied] == [(slow, 2.0), (fast, 0.0)]
    owner = f.parts[partition_of(slow, P)].keys
    assert client.hget(owner.pol_state_base + slow, "ad") == b"2000"
    assert fleet.delay(slow) == 2.0
    detail = Hosts(f).show(slow)
    assert (detail.auto_delay, detail.delay.source) == (2.0, "auto_delay")
    assert hosts(lease_all(f)) == {slow: 1, fast: 5}
    clock.advance(1.0)
    assert lease_all(f) == []
    clock.advance(1.0)
    assert hosts(lease_all(f)) == {slow: 1}
    assert fleet.disable()
    assert all(client.hget(sub.keys.control, "autothrottle") is None for sub in f.parts)


def test_a_429_blocks_the_site_in_its_partition_and_hosts_says_so(
    client: redis.Redis, clock: Clock
) -> None:
    f: FrontierCore = polite(client, clock)
    slow, fast = two_sites()
    f.push(site(slow, 6) + site(fast, 6))
    got = lease_all(f)
    first = next(x for x in got if slow in x.envelope.url)
    assert f.defer(first, "429", retry_after=5.0) == "deferred"
    f.ack([x for x in got if x is not first])
    detail = Hosts(f).show(slow)
    assert detail.block is not None and "429/503" in (detail.why or "")
    page = Hosts(f).top(limit=10)
    assert next(r for r in page.hosts if r.key == slow).blocked_until is not None
    clock.advance(1.0)
    assert hosts(lease_all(f)) == {fast: 1}
    clock.advance(5.0)
    assert hosts(lease_all(f)) == {slow: 2}


def test_redcrawl_hosts_steers_a_site_of_a_partitioned_crawl(
    redis7: RedisServer, client: redis.Redis
) -> None:
    s = Settings(partitions=P, politeness_concurrency=2, politeness_randomize=False)
    f = open_frontier(client, s, "cli")
    assert isinstance(f, PartitionedFrontier)
    slow, fast = two_sites()
    f.push(site(slow, 4) + site(fast, 4))

    def cli(*args: str) -> dict[str, Any]:
        result = runner.invoke(
            app, ["hosts", *args, "--redis-url", redis7.url, "--crawl", "cli", "--json"]
        )
        assert result.exit_code == 0, result.output
        out: dict[str, Any] = json.loads(result.output)
        return out

    assert cli("set", slow, "--concurrency", "1")["override"] == {"concurrency": 1}
    assert hosts(lease_all(f)) == {slow: 1, fast: 2}
    assert cli("block", fast, "--for", "10m")["why"].startswith("blocked by operator")
    listed = cli()
    assert {h["key"] for h in listed["hosts"]} == {slow, fast}
    assert cli("reset", slow)["override"] == {}
    owner = f.parts[partition_of(slow, P)].keys
    assert client.hget(owner.pol_override, slow) is None
