"""Politeness and observation of a crawl of 16 partitions on a real Redis Cluster (3
masters; tests/cluster.py): robots.txt's Crawl-delay (the cache at the anchor, the delay
in the site's partition: two slots, often two masters), an operator's override, the
hosts list over every partition and fleet-wide AutoThrottle, each enforced by the lease
step of the site's partition; the metrics snapshot of the crawl equals the same crawl's in
one partition. On one server with P = 4: tests/test_partitions_politeness.py and
tests/test_partitions_metrics.py."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from redcrawl.frontier import FrontierCore, PartitionedFrontier
from redcrawl.keys import partition_of
from redcrawl.metrics.snapshot import SnapshotReader
from redcrawl.politeness.autothrottle import FleetThrottle, ThrottleRule, Update
from redcrawl.politeness.hosts import Hosts
from redcrawl.politeness.robots import RobotsCache, RobotsEntry
from redcrawl.settings import Settings

from .conftest import Clock
from .partition_helpers import hosts, hosts_in, lease_all, polite_crawl, site
from .test_partitions_metrics import run_the_same_crawl, same

pytestmark = pytest.mark.cluster

P = 16


@pytest.fixture
def client(cluster_client: redis.Redis) -> redis.Redis:
    return cluster_client


def polite(client: redis.Redis, clock: Clock, partitions: int, crawl: str) -> Any:
    return polite_crawl(client, clock, crawl, partitions, max_attempts=2, as_worker=True)


def test_crawl_delay_override_autothrottle_and_hosts_list_on_the_cluster(
    client: redis.Redis, clock: Clock
) -> None:
    f = polite(client, clock, P, "pc")
    assert isinstance(f, PartitionedFrontier)
    robots_site = hosts_in(5, P, 1, "r")[0]
    operator_site = hosts_in(9, P, 1, "o")[0]
    throttled_site = hosts_in(14, P, 1, "t")[0]
    free_site = hosts_in(0, P, 1, "f")[0]
    f.push(site(robots_site, 5) + site(operator_site, 5) + site(throttled_site, 5))
    f.push(site(free_site, 5))
    cache = RobotsCache(client, f.keys, max_bytes=1 << 20)
    origin = f"http://{robots_site}"
    assert cache.lookup([origin])[0].state == "fetch"
    stored = cache.store(
        origin,
        RobotsEntry(200, b"Crawl-delay: 2\n"),
        ttl=60,
        politeness_key=robots_site,
        crawl_delay=2.0,
    )
    assert (stored.stored, stored.override) == (True, 1)
    Hosts(f).set(operator_site, delay=2.0)
    fleet = FleetThrottle(client, f.keys, ThrottleRule(1.0, 0.0, 60.0, 0.0))
    fleet.enable()
    fleet.update([Update(throttled_site, 2.0, 200)])
    for key, source in (
        (robots_site, "crawl_delay"),
        (operator_site, "override"),
        (throttled_site, "auto_delay"),
    ):
        assert partition_of(key, P) != 0
        d = Hosts(f).show(key)
        assert (d.delay.value, d.delay.source) == (2.0, source)
    page = Hosts(f).top(limit=100)
    assert page.complete and {r.key for r in page.hosts} == {
        robots_site,
        operator_site,
        throttled_site,
        free_site,
    }
    spaced = {robots_site: 1, operator_site: 1, throttled_site: 1}
    assert hosts(lease_all(f)) == {**spaced, free_site: 5}
    clock.advance(1.0)
    assert lease_all(f) == []
    clock.advance(1.1)  # (a worker's start window is added to a delay)
    assert hosts(lease_all(f)) == spaced
    fleet.disable()
    f.purge()


def test_snapshot_of_sixteen_partitions_equals_one_on_the_cluster(
    client: redis.Redis, clock: Clock
) -> None:
    clock.advance(-30)  # behind the servers' clock, which the snapshot reads "now" by
    crawls: list[FrontierCore] = []
    for name, partitions in (("one", 1), ("parts", P)):
        f = polite(client, clock, partitions, name)
        run_the_same_crawl(f, clock)
        crawls.append(f)
    snap = {c.crawl: c for c in SnapshotReader(client, Settings(lease_ttl=60.0)).read().crawls}
    same(snap["one"], snap["parts"])
    assert snap["parts"].counts.dead == 1 and snap["parts"].keys_blocked == 1
    assert crawls[1].workers().keys() == {"w1", "w2"}
    for f in crawls:
        f.purge()
